//! `gpuwatch doctor [--json] [--slurm]` and the preflight of `gpuwatch run --preflight`: open
//! NVML, read the facts and print the findings of [`crate::sampler::doctor`], one line each with
//! what to do. Exit 0 when clean, 1 with findings, [`EXIT_NO_NVML`] without NVML.
//!
//! `--slurm` is for Slurm's `HealthCheckProgram` (as NHC is): the node is unfit when a finding
//! says a job should not start on it (critical: a missing or unusable GPU, a pending row remap or
//! page retirement, a recovery action other than none, an NVLink down) or a PCIe link trained
//! narrower than the GPU's width. An unfit node is drained with the first such finding as the
//! reason (`gpuwatch: doctor …`), unless someone else drained it; a node found fit again is
//! resumed when its drain is one doctor made. Exit 0 when fit (warnings are printed, not acted
//! on), 1 when unfit.

use std::io::Write as _;
use std::path::PathBuf;

use super::GlobalArgs;
use crate::action::drain::{
    doctor_reason, drain_node, reason_line, resume_node, DrainSection, Drained, Resumed,
    DOCTOR_REASON,
};
use crate::config::Config;
use crate::pipeline::EXIT_NO_NVML;
use crate::sampler::doctor::{self, Finding, Inputs};
use crate::sampler::expected::ExpectedOptions;
use crate::sampler::{Sampler, SamplerError};

/// Arguments of `doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the findings as a JSON array of {gpu, pci_bus_id, mig (only on a finding about a
    /// MIG device), check, severity, message, fix}.
    #[arg(long)]
    pub json: bool,
    /// Configuration file: its state directory's GPU history (gpus.json) and
    /// `[daemon] expected_gpus` count in the missing-GPU check (default: the PCI bus only).
    #[arg(long, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// As Slurm's HealthCheckProgram: drain this node when a finding makes it unfit (reason
    /// `gpuwatch: doctor …`), resume it when fit again and the drain was doctor's; never touch
    /// someone else's drain. Node name, scontrol and its time limit from `[actions.drain]`.
    #[arg(long)]
    pub slurm: bool,
    /// With --slurm: say what would be drained or resumed, and change nothing.
    #[arg(long, requires = "slurm")]
    pub dry_run: bool,
}

/// Whether `f` makes the node unfit for jobs (see the module docs).
pub fn unfit(f: &Finding) -> bool {
    f.severity == crate::model::Severity::Critical
        || f.check == crate::sampler::doctor::Check::PcieLinkWidth
}

/// Opens NVML, compares the GPUs with the expected set (`expected`, read only) and judges
/// everything; the caller's own processes are those of the process that started gpuwatch and
/// its descendants, and the job's GPUs (or MIG device) are those `CUDA_VISIBLE_DEVICES` names.
pub fn examine(
    global: &GlobalArgs,
    expected: &ExpectedOptions,
) -> Result<Vec<Finding>, SamplerError> {
    let mut cfg = global.sampler_config();
    cfg.xid_events = false;
    let mut sampler = Sampler::open(&cfg)?;
    let expected = ExpectedOptions {
        record: false,
        ..expected.clone()
    };
    let missing = sampler.check_expected(&expected).to_vec();
    let inputs = Inputs {
        cuda_visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        missing,
        ..doctor::gather(&mut sampler)
    };
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let caller = std::os::unix::process::parent_id();
    Ok(doctor::findings(&inputs, &|p| {
        doctor::caller_owns(p, uid, caller)
    }))
}

/// The findings as people read them: one line each, then `no findings` or `N findings`.
pub fn render_text(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        out.push_str(&f.line());
        out.push('\n');
    }
    match findings.len() {
        0 => out.push_str("no findings\n"),
        1 => out.push_str("1 finding\n"),
        n => out.push_str(&format!("{n} findings\n")),
    }
    out
}

/// The config at `path`, when one is named.
pub fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<Option<Config>> {
    path.map(crate::config::load).transpose()
}

/// The findings, with the expected GPUs of `config` when there is one.
pub fn examine_with(
    global: &GlobalArgs,
    config: Option<&Config>,
) -> Result<Vec<Finding>, SamplerError> {
    let expected = config.map_or_else(ExpectedOptions::default, |c| c.expected_options(false));
    examine(global, &expected)
}

/// What `doctor --slurm` and `slurm prolog` act with.
pub struct SlurmHand {
    /// `[actions.drain]`, each `scontrol` call held to at most 10 s (slurmd kills a health
    /// check after 60 s; a node has two calls to make).
    pub section: DrainSection,
    /// This node's Slurm name.
    pub node: String,
    /// Say, do not act: asked for, or simulated GPUs (unless `GPUWATCH_SIM_REAL_DRAIN`).
    pub dry_run: bool,
}

impl SlurmHand {
    /// The hand for `config` (or the defaults); a dry run when `dry_run`.
    pub fn new(global: &GlobalArgs, config: Option<&Config>, dry_run: bool) -> SlurmHand {
        let (mut section, host) = match config {
            Some(c) => (c.actions.drain.clone(), c.hostname()),
            None => (DrainSection::default(), crate::sys::hostname()),
        };
        section.timeout.ms = section.timeout.ms.min(10_000);
        SlurmHand {
            node: section.node_name(&host),
            section,
            dry_run: dry_run || crate::action::drain::simulated_dry_run(global.sim.is_some()),
        }
    }

    /// Drains the node with `reason` (its own earlier drain, `mine`, or someone else's are left
    /// as they are); says what happened on stderr.
    pub fn drain(&self, reason: &str, mine: impl Fn(&str) -> bool) {
        let node = &self.node;
        if self.dry_run {
            eprintln!("gpuwatch: dry run: would drain node {node} with reason {reason:?}");
            return;
        }
        match drain_node(&self.section, node, reason, mine) {
            Drained::Now => eprintln!("gpuwatch: node {node} drained ({reason})"),
            Drained::Already => eprintln!("gpuwatch: node {node} already drained by this check"),
            Drained::LeftAlone(why) => eprintln!("gpuwatch: node {node} left alone: {why}"),
            Drained::Failed(e) => eprintln!("gpuwatch: draining node {node} failed: {e}"),
        }
    }
}

/// Runs `doctor`.
pub fn doctor(global: &GlobalArgs, args: &DoctorArgs) -> anyhow::Result<i32> {
    let config = load_config(args.config.as_deref())?;
    let findings = match examine_with(global, config.as_ref()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gpuwatch: {e}");
            if args.slurm {
                let hand = SlurmHand::new(global, config.as_ref(), args.dry_run);
                return Ok(slurm_unreadable(&hand, &e));
            }
            return Ok(EXIT_NO_NVML);
        }
    };
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &findings)?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(render_text(&findings).as_bytes())?;
    }
    stdout.flush()?;
    if args.slurm {
        let hand = SlurmHand::new(global, config.as_ref(), args.dry_run);
        return Ok(slurm_health(&findings, &hand));
    }
    Ok(i32::from(!findings.is_empty()))
}

/// `--slurm` when NVML does not open: a node without NVIDIA's driver has nothing to check
/// (exit 0: a CPU node under a cluster-wide health check); a driver that is there but does not
/// start makes the node unfit.
fn slurm_unreadable(hand: &SlurmHand, e: &SamplerError) -> i32 {
    if matches!(e, SamplerError::NoDriver { .. }) {
        println!("node {}: no NVIDIA driver, nothing to check", hand.node);
        return 0;
    }
    let reason = reason_line(&format!("{DOCTOR_REASON} NVML does not start: {e}"));
    hand.drain(&reason, doctor_reason);
    1
}

/// The drain reason for `unfit` findings (not empty): `PREFIX FIRST-FINDING (+N more)`, on one
/// line within Slurm's bound.
pub fn unfit_reason(prefix: &str, unfit: &[&Finding]) -> String {
    let more = match unfit.len() {
        0 | 1 => String::new(),
        n => format!(" (+{} more)", n - 1),
    };
    let first = unfit.first().map(|f| f.line()).unwrap_or_default();
    reason_line(&format!("{prefix} {first}{more}"))
}

/// `--slurm`: drains or resumes the node as the findings say; the exit code.
fn slurm_health(findings: &[Finding], hand: &SlurmHand) -> i32 {
    let node = &hand.node;
    let Some(worst) = findings.iter().find(|f| unfit(f)) else {
        if hand.dry_run {
            println!("node {node} is fit (dry run: a drain of doctor's would be resumed)");
            return 0;
        }
        match resume_node(&hand.section, node, doctor_reason) {
            Resumed::Now(was) => println!("node {node} is fit again: resumed (was: {was})"),
            Resumed::NotDrained => println!("node {node} is fit"),
            Resumed::LeftAlone(why) => println!("node {node} is fit; {why}"),
            Resumed::Failed(e) => {
                eprintln!("gpuwatch: node {node} is fit, but resuming it failed: {e}");
            }
        }
        return 0;
    };
    let unfit_ones: Vec<&Finding> = findings.iter().filter(|f| unfit(f)).collect();
    let reason = unfit_reason(DOCTOR_REASON, &unfit_ones);
    println!("node {node} is unfit: {}", worst.line());
    hand.drain(&reason, doctor_reason);
    1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Severity;
    use crate::sampler::doctor::Check;

    #[test]
    fn text_ends_with_the_count() {
        assert_eq!(render_text(&[]), "no findings\n");
        let f = Finding {
            gpu: Some(2),
            pci_bus_id: "00000000:3A:00.0".into(),
            mig: None,
            check: Check::PersistenceMode,
            severity: Severity::Warning,
            message: "persistence mode is off — each job start pays driver init".into(),
            fix: "enable with nvidia-smi -pm 1".into(),
        };
        assert_eq!(
            render_text(&[f.clone(), f]),
            "GPU 2 (00000000:3A:00.0): persistence mode is off — each job start pays driver init; enable with nvidia-smi -pm 1\n\
             GPU 2 (00000000:3A:00.0): persistence mode is off — each job start pays driver init; enable with nvidia-smi -pm 1\n\
             2 findings\n"
        );
    }
}
