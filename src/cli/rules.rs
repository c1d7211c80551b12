//! `gpuwatch` subcommands: check,test,replay (placeholder until implemented).

use super::GlobalArgs;

/// Arguments of `check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {}

/// Runs `check`.
pub fn check(_global: &GlobalArgs, _args: &CheckArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`check` is not implemented yet")
}

/// Arguments of `test`.
#[derive(Debug, clap::Args)]
pub struct TestArgs {}

/// Runs `test`.
pub fn test(_global: &GlobalArgs, _args: &TestArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`test` is not implemented yet")
}

/// Arguments of `replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {}

/// Runs `replay`.
pub fn replay(_global: &GlobalArgs, _args: &ReplayArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`replay` is not implemented yet")
}
