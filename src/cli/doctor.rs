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

/// What every drain reason `doctor --slurm` writes starts with (how it knows its own).
pub const DOCTOR_REASON: &str = "gpuwatch: doctor";

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

/// A config (when one was named) and the findings made with it.
pub type Examined = (Option<crate::config::Config>, Vec<Finding>);

/// The config at `path` (if any) and the findings with its expected GPUs; `Err(code)` (said on
/// stderr) when NVML cannot be opened.
pub fn load_and_examine(
    global: &GlobalArgs,
    path: Option<&std::path::Path>,
) -> anyhow::Result<Result<Examined, i32>> {
    let config = match path {
        Some(p) => Some(crate::config::load(p)?),
        None => None,
    };
    let expected = config
        .as_ref()
        .map_or_else(ExpectedOptions::default, |c| c.expected_options(false));
    Ok(match examine(global, &expected) {
        Ok(f) => Ok((config, f)),
        Err(e) => {
            eprintln!("gpuwatch: {e}");
            Err(EXIT_NO_NVML)
        }
    })
}

/// Runs `doctor`.
pub fn doctor(global: &GlobalArgs, args: &DoctorArgs) -> anyhow::Result<i32> {
    let (config, findings) = match load_and_examine(global, args.config.as_deref())? {
        Ok(found) => found,
        Err(code) => return Ok(code),
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
        let (section, host) = match &config {
            Some(c) => (c.actions.drain.clone(), c.hostname()),
            None => (
                crate::action::drain::DrainSection::default(),
                crate::sys::hostname(),
            ),
        };
        return Ok(slurm_health(&findings, &section, &host, args.dry_run));
    }
    Ok(i32::from(!findings.is_empty()))
}

/// `--slurm`: drains or resumes the node as the findings say; the exit code.
fn slurm_health(
    findings: &[Finding],
    section: &crate::action::drain::DrainSection,
    host: &str,
    dry_run: bool,
) -> i32 {
    use crate::action::drain::{drain_node, resume_node, Drained, Resumed};
    let node = section.node_name(host);
    let Some(worst) = findings.iter().find(|f| unfit(f)) else {
        if dry_run {
            println!("node {node} is fit (dry run: a drain of doctor's would be resumed)");
            return 0;
        }
        match resume_node(section, &node, |r| r.starts_with(DOCTOR_REASON)) {
            Resumed::Now(was) => println!("node {node} is fit again: resumed (was: {was})"),
            Resumed::NotDrained => println!("node {node} is fit"),
            Resumed::LeftAlone(why) => println!("node {node} is fit; {why}"),
            Resumed::Failed(e) => {
                eprintln!("gpuwatch: node {node} is fit, but resuming it failed: {e}");
            }
        }
        return 0;
    };
    let unfit_count = findings.iter().filter(|f| unfit(f)).count();
    let more = match unfit_count {
        1 => String::new(),
        n => format!(" (+{} more)", n - 1),
    };
    let reason =
        crate::action::drain::reason_line(&format!("{DOCTOR_REASON} {}{more}", worst.line()));
    if dry_run {
        println!("node {node} is unfit: would drain it with reason {reason:?}");
        return 1;
    }
    match drain_node(section, &node, &reason) {
        Drained::Now => println!("node {node} is unfit: drained ({reason})"),
        Drained::Already => println!("node {node} is unfit: already drained by gpuwatch"),
        Drained::LeftAlone(why) => println!("node {node} is unfit; {why}"),
        Drained::Failed(e) => {
            eprintln!("gpuwatch: node {node} is unfit, but draining it failed: {e}")
        }
    }
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
