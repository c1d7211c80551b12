//! `gpuwatch doctor [--json]` and the preflight of `gpuwatch run --preflight`: open NVML, read
//! the facts and print the findings of [`crate::sampler::doctor`], one line each with what to
//! do. Exit 0 when clean, 1 with findings, [`EXIT_NO_NVML`] without NVML.

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

/// Runs `doctor`.
pub fn doctor(global: &GlobalArgs, args: &DoctorArgs) -> anyhow::Result<i32> {
    let expected = match &args.config {
        Some(p) => crate::config::load(p)?.expected_options(false),
        None => ExpectedOptions::default(),
    };
    let findings = match examine(global, &expected) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gpuwatch: {e}");
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
    Ok(i32::from(!findings.is_empty()))
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
