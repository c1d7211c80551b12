//! `gpuwatch` subcommands: run,attach (placeholder until implemented).

use super::GlobalArgs;

/// Arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {}

/// Runs `run`.
pub fn run(_global: &GlobalArgs, _args: &RunArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`run` is not implemented yet")
}

/// Arguments of `attach`.
#[derive(Debug, clap::Args)]
pub struct AttachArgs {}

/// Runs `attach`.
pub fn attach(_global: &GlobalArgs, _args: &AttachArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`attach` is not implemented yet")
}
