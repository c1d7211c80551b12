//! `gpuwatch` subcommands: status,devices (placeholder until implemented).

use super::GlobalArgs;

/// Arguments of `status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {}

/// Runs `status`.
pub fn status(_global: &GlobalArgs, _args: &StatusArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`status` is not implemented yet")
}

/// Arguments of `devices`.
#[derive(Debug, clap::Args)]
pub struct DevicesArgs {}

/// Runs `devices`.
pub fn devices(_global: &GlobalArgs, _args: &DevicesArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`devices` is not implemented yet")
}
