//! `gpuwatch slurm prolog`: Slurm's `Prolog` (run by slurmd as root before a job starts on the
//! node) checks the job's GPUs with `doctor`'s checks and refuses the job when one is unfit.
//!
//! The job's GPUs are `SLURM_JOB_GPUS` (the indices Slurm allocated, as in gres.conf's
//! `/dev/nvidiaN`: NVML's order on a standard install), else `CUDA_VISIBLE_DEVICES`. A job
//! without GPUs passes without NVML being opened. A finding about one of its GPUs that makes a
//! node unfit (see [`super::doctor::unfit`]; a missing GPU counts for every GPU job, since the
//! indices then shift) refuses it: the node is drained with the finding as the reason
//! (`gpuwatch: prolog job N …`, unless someone else drained it) and the exit code is 1, on which
//! Slurm requeues the job elsewhere. Exit 0 otherwise.

use std::path::PathBuf;

use super::GlobalArgs;

/// Arguments of `slurm`.
#[derive(Debug, clap::Args)]
pub struct SlurmArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: SlurmAction,
}

/// `slurm` actions.
#[derive(Debug, clap::Subcommand)]
pub enum SlurmAction {
    /// As Slurm's Prolog: refuse the job (exit 1, node drained with the reason) when one of its
    /// GPUs is unfit.
    Prolog(PrologArgs),
}

/// Arguments of `slurm prolog`.
#[derive(Debug, clap::Args)]
pub struct PrologArgs {
    /// Configuration file: `[actions.drain]` (node name, scontrol) and the expected GPUs.
    #[arg(long, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Say what would be done; drain nothing (the exit code is the same).
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `slurm`.
pub fn slurm(global: &GlobalArgs, args: &SlurmArgs) -> anyhow::Result<i32> {
    match &args.action {
        SlurmAction::Prolog(a) => prolog(global, a),
    }
}

/// The job's GPU indices from `SLURM_JOB_GPUS`, else `CUDA_VISIBLE_DEVICES` (plain indices
/// only; UUIDs and MIG names are matched by `doctor` itself).
fn job_gpus(slurm: Option<&str>, cuda: Option<&str>) -> Option<Vec<u32>> {
    let list = slurm.or(cuda)?.trim();
    if list.is_empty() {
        return None;
    }
    Some(
        list.split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
    )
}

fn prolog(global: &GlobalArgs, a: &PrologArgs) -> anyhow::Result<i32> {
    use crate::action::drain::{prolog_reason, reason_line, PROLOG_REASON};
    let job = std::env::var("SLURM_JOB_ID").unwrap_or_else(|_| "?".into());
    let Some(gpus) = job_gpus(
        std::env::var("SLURM_JOB_GPUS").ok().as_deref(),
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
    ) else {
        return Ok(0);
    };
    // gpuwatch's own config mistake must not take the node out (a failing prolog drains it)
    let config = match super::doctor::load_config(a.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpuwatch: job {job} not checked: {e:#}");
            return Ok(0);
        }
    };
    let hand = super::doctor::SlurmHand::new(global, config.as_ref(), a.dry_run);
    let findings = match super::doctor::examine_with(global, config.as_ref()) {
        Ok(f) => f,
        Err(crate::sampler::SamplerError::NoDriver { .. }) => {
            eprintln!(
                "gpuwatch: job {job} asks for GPUs {gpus:?}, but this node has no NVIDIA driver"
            );
            return Ok(0);
        }
        Err(e) => {
            let why = format!("NVML does not start: {e}");
            eprintln!("gpuwatch: job {job} refused: {why}");
            hand.drain(
                &reason_line(&format!("{PROLOG_REASON} job {job} {why}")),
                prolog_reason,
            );
            return Ok(1);
        }
    };
    let refusing: Vec<_> = findings
        .iter()
        .filter(|f| super::doctor::unfit(f) && f.gpu.is_none_or(|g| gpus.contains(&g)))
        .collect();
    let Some(first) = refusing.first() else {
        return Ok(0);
    };
    // (on stderr: slurmd logs it)
    eprintln!("gpuwatch: job {job} refused: {}", first.line());
    hand.drain(
        &super::doctor::unfit_reason(&format!("{PROLOG_REASON} job {job}"), &refusing),
        prolog_reason,
    );
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jobs_gpus_come_from_slurm_first() {
        assert_eq!(job_gpus(Some("0,3"), Some("5")), Some(vec![0, 3]));
        assert_eq!(job_gpus(None, Some("2,1")), Some(vec![2, 1]));
        assert_eq!(job_gpus(Some(""), None), None);
        assert_eq!(job_gpus(None, None), None);
    }
}
