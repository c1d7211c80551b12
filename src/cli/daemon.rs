//! `gpuwatch` subcommands: daemon,notify_test (placeholder until implemented).

use super::GlobalArgs;

/// Arguments of `daemon`.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {}

/// Runs `daemon`.
pub fn daemon(_global: &GlobalArgs, _args: &DaemonArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`daemon` is not implemented yet")
}

/// Arguments of `notify_test`.
#[derive(Debug, clap::Args)]
pub struct NotifyTestArgs {}

/// Runs `notify_test`.
pub fn notify_test(_global: &GlobalArgs, _args: &NotifyTestArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`notify_test` is not implemented yet")
}
