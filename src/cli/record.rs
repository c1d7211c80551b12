//! `gpuwatch` subcommands: run (placeholder until implemented).

use super::GlobalArgs;

/// Arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {}

/// Runs `run`.
pub fn run(_global: &GlobalArgs, _args: &RecordArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`run` is not implemented yet")
}
