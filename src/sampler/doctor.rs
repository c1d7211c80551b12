//! `gpuwatch doctor`: a preflight a user runs before a long job (and `run --preflight`). Each
//! check looks at what NVML (and the PCI bus) says now and reports a [`Finding`] with what to do:
//!
//! * PCIe link: the link's maximum generation below the GPU's own (the slot or the BIOS limits
//!   it), the current width below the maximum width, and — only under load — the current
//!   generation below the maximum. An idle GPU lowers its link generation to save power (gen 1
//!   at idle is normal), so the current generation is judged only while the GPU is busy
//!   (utilization ≥ [`BUSY_UTIL_PCT`] %); at idle only the slot's maximum and the width count.
//! * persistence mode off; a pending row remap or page retirement (needs a GPU reset); NVIDIA's
//!   recovery action (field 230) other than none; the enforced power limit below the default;
//!   applications clocks other than the defaults, or clocks held by a clock setting (clock
//!   event reason `applications_clocks_setting`, 0x2: locked clocks); ECC disabled on a GPU that
//!   supports it;
//! * foreign processes already holding memory on the GPUs `CUDA_VISIBLE_DEVICES` names (every
//!   GPU when it is unset): another user's, or not the caller's — the caller is the process that
//!   started gpuwatch (the shell); it and its descendants are yours. An entry that names a MIG
//!   device (`MIG-<UUID>`, `MIG-GPU-<UUID>/<GI>/<CI>`: read as `gpuwatch devices` reads it,
//!   [`crate::model::visible::cuda_visible_mig`]) gives the job that MIG device only: a process on
//!   another MIG device of the same GPU is no finding, one on it is, and the finding names it;
//!   one on the GPU that no MIG device lists (NVML places processes for root only on real
//!   drivers) may be on the job's: a finding that says gpuwatch cannot place it;
//! * expected GPUs that NVML does not enumerate ([`super::expected`]);
//! * GPM (the profiling metrics: SM active, tensor and DRAM activity) failing on a GPU that has
//!   it — another client holds it, or the driver is in trouble; a GPU without GPM (before
//!   Hopper) is no finding, `status --json` says why (`gpus[].gpm`).
//!
//! [`gather`] reads the facts through the open [`Sampler`] (one snapshot, then a few one-shot
//! calls per GPU on its `Nvml` handle; a lost or stalled GPU is not asked again), [`findings`]
//! judges them: a pure function, tested without NVML.

use serde::Serialize;

use crate::model::visible::cuda_visible_mig;
use crate::model::{DeviceId, DeviceState, Metric, MigSample, MissingGpu, ProcSample, Severity};

use super::{GpmStatus, Sampler};

/// Utilization from which a GPU counts as busy for the link-generation check.
pub const BUSY_UTIL_PCT: f64 = 50.0;

/// Clock event reason "applications clocks setting" (locked or applications clocks).
const REASON_APP_CLOCKS: u64 = 0x2;

/// Which check found something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The slot (or BIOS) limits the link below the GPU's generation, or a busy link runs slower.
    PcieLinkGen,
    /// The link is narrower than the GPU's width.
    PcieLinkWidth,
    /// Persistence mode is off.
    PersistenceMode,
    /// A row remap or page retirement waits for a GPU reset.
    PendingRepair,
    /// NVIDIA's recovery action is not none.
    RecoveryAction,
    /// The enforced power limit is below the default.
    PowerLimit,
    /// Applications clocks differ from the defaults.
    ApplicationsClocks,
    /// Clocks are held by a clock setting (locked clocks).
    LockedClocks,
    /// ECC is off on a GPU that supports it.
    EccDisabled,
    /// Another user's (or another session's) process holds memory on a GPU the job will use.
    ForeignProcess,
    /// An expected GPU is not enumerated.
    GpuMissing,
    /// The GPU answers GPU_IS_LOST, or an NVML call on it hangs.
    GpuUnusable,
    /// The GPU has GPM but its calls fail: the GPM metrics are absent.
    GpmFailing,
    /// An NVLink is down.
    NvlinkDown,
    /// An NVLink runs below the speed of the GPU's other links.
    NvlinkSpeed,
}

/// One thing that needs attention.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// NVML index of the GPU; `None` for a missing GPU.
    pub gpu: Option<u32>,
    /// The GPU's bus id (empty when unknown).
    pub pci_bus_id: String,
    /// The MIG device it is about (`MIG 1g.10gb 0/7/0`), when about one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
    /// Which check.
    pub check: Check,
    /// How bad: critical when a job should not start, warning when it would run worse.
    pub severity: Severity,
    /// What is wrong and what it costs.
    pub message: String,
    /// What to do.
    pub fix: String,
}

impl Finding {
    /// The line people read: `GPU 2 (00000000:3A:00.0): MESSAGE; FIX`, and `GPU 0
    /// (00000000:18:00.0) MIG 1g.10gb 0/8/0: …` for one about a MIG device.
    pub fn line(&self) -> String {
        let mut who = match (self.gpu, self.pci_bus_id.is_empty()) {
            (Some(i), false) => format!("GPU {i} ({})", self.pci_bus_id),
            (Some(i), true) => format!("GPU {i}"),
            (None, false) => format!("GPU {}", self.pci_bus_id),
            (None, true) => "a GPU".to_string(),
        };
        if let Some(m) = &self.mig {
            who.push(' ');
            who.push_str(m);
        }
        format!("{who}: {}; {}", self.message, self.fix)
    }
}

/// What doctor knows about one GPU (`None`: NVML could not say).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuFacts {
    /// Identity.
    pub id: DeviceId,
    /// The device's state at the snapshot (lost or stalled GPUs get no other checks).
    pub state: DeviceState,
    /// Utilization, %.
    pub util: Option<f64>,
    /// Current PCIe link generation.
    pub link_gen: Option<u32>,
    /// The link's maximum generation in this slot (min of GPU and slot).
    pub link_gen_max: Option<u32>,
    /// The GPU's own maximum generation.
    pub gpu_link_gen_max: Option<u32>,
    /// Current link width (lanes).
    pub link_width: Option<u32>,
    /// Maximum link width.
    pub link_width_max: Option<u32>,
    /// Persistence mode on.
    pub persistence: Option<bool>,
    /// A row remap is pending.
    pub remap_pending: Option<bool>,
    /// A page retirement is pending.
    pub retired_pending: Option<bool>,
    /// Field 230: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset.
    pub recovery_action: Option<u32>,
    /// Enforced power limit, W.
    pub power_limit_w: Option<f64>,
    /// Default power limit, W.
    pub power_default_limit_w: Option<f64>,
    /// Applications SM clock and its default, MHz.
    pub app_sm_clock: Option<(u32, u32)>,
    /// Applications memory clock and its default, MHz.
    pub app_mem_clock: Option<(u32, u32)>,
    /// Clock event reasons bitmask.
    pub clock_event_reasons: Option<u64>,
    /// ECC currently enabled (`None`: the GPU has no ECC).
    pub ecc_enabled: Option<bool>,
    /// Where GPM stands.
    pub gpm: GpmStatus,
    /// Its NVLinks (`None`: no NVLink, or not read).
    pub nvlink: Option<crate::model::nvlink::NvlinkStatus>,
}

/// Everything the checks judge.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// Every enumerated GPU.
    pub gpus: Vec<GpuFacts>,
    /// The GPU processes.
    pub processes: Vec<ProcSample>,
    /// The MIG devices of the GPUs with MIG on (each with the processes on it).
    pub mig: Vec<MigSample>,
    /// `CUDA_VISIBLE_DEVICES` as set for the job (`None` = unset: every GPU).
    pub cuda_visible_devices: Option<String>,
    /// Expected GPUs NVML does not enumerate.
    pub missing: Vec<MissingGpu>,
}

#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "small counts"
)]
fn as_u32(v: Option<f64>) -> Option<u32> {
    v.filter(|x| x.is_finite() && *x >= 0.0).map(|x| x as u32)
}

/// Reads the facts: one snapshot (values, processes, MIG devices, NVLinks) and, for each GPU that
/// answers, the one-shot queries the sampler does not make (link, persistence, default power
/// limit, applications clocks, ECC mode). `CUDA_VISIBLE_DEVICES` and the missing GPUs are the
/// caller's to fill in.
pub fn gather(sampler: &mut Sampler) -> Inputs {
    let snap = sampler.sample();
    let nvml = sampler.nvml();
    let gpm = sampler.gpm();
    let mut gpus = Vec::with_capacity(snap.gpus.len());
    for g in &snap.gpus {
        let mut f = GpuFacts {
            id: g.id.clone(),
            state: g.state,
            gpm: gpm.get(g.id.index as usize).cloned().unwrap_or_default(),
            util: g.get(Metric::Util),
            remap_pending: g.get(Metric::RemapPending).map(|v| v != 0.0),
            retired_pending: g.get(Metric::RetiredPending).map(|v| v != 0.0),
            recovery_action: as_u32(g.get(Metric::RecoveryAction)),
            power_limit_w: g.get(Metric::PowerLimit),
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "bitmask"
            )]
            clock_event_reasons: g.get(Metric::ClockEventReasons).map(|m| m as u64),
            // the snapshot's: only while current (not a lost or stalled GPU's old reading)
            nvlink: snap
                .nvlink
                .iter()
                .find(|n| n.gpu == g.id.index)
                .map(|n| crate::model::nvlink::NvlinkStatus::clone(n)),
            ..GpuFacts::default()
        };
        if g.state == DeviceState::Ok {
            if let Ok(dev) = nvml.device_by_index(g.id.index) {
                one_shot(nvml, &dev, &mut f);
            }
        }
        gpus.push(f);
    }
    Inputs {
        gpus,
        processes: snap.processes.unwrap_or_default(),
        mig: snap.mig,
        ..Inputs::default()
    }
}

/// The queries only doctor makes, on one device.
fn one_shot(nvml: &nvml_wrapper::Nvml, dev: &nvml_wrapper::Device<'_>, f: &mut GpuFacts) {
    use nvml_wrapper::enum_wrappers::device::Clock;
    f.link_gen = dev.current_pcie_link_gen().ok();
    f.link_gen_max = dev.max_pcie_link_gen().ok();
    f.gpu_link_gen_max = gpu_max_link_gen(nvml, dev);
    f.link_width = dev.current_pcie_link_width().ok();
    f.link_width_max = dev.max_pcie_link_width().ok();
    f.persistence = dev.is_in_persistent_mode().ok();
    f.power_default_limit_w = dev
        .power_management_limit_default()
        .ok()
        .map(|mw| f64::from(mw) / 1000.0);
    let app = |c: Clock| {
        let now = dev.applications_clock(c).ok()?;
        Some((now, dev.default_applications_clock(c).ok()?))
    };
    f.app_sm_clock = app(Clock::SM);
    f.app_mem_clock = app(Clock::Memory);
    f.ecc_enabled = dev.is_ecc_enabled().ok().map(|m| m.currently_enabled);
}

/// `nvmlDeviceGetGpuMaxPcieLinkGeneration` (the GPU's own maximum, whatever the slot), which
/// nvml-wrapper does not wrap; `None` when the driver lacks it.
fn gpu_max_link_gen(nvml: &nvml_wrapper::Nvml, dev: &nvml_wrapper::Device<'_>) -> Option<u32> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetGpuMaxPcieLinkGeneration
        .as_ref()
        .ok()?;
    let mut value: std::os::raw::c_uint = 0;
    // SAFETY: the symbol comes from the loaded NVML library with the declared signature; the
    // handle belongs to that library and lives as long as `dev`; `value` is a valid out pointer.
    let rc = unsafe { sym(dev.handle(), &mut value) };
    (rc == 0).then_some(value)
}

fn finding(
    g: &GpuFacts,
    check: Check,
    severity: Severity,
    message: String,
    fix: String,
) -> Finding {
    Finding {
        gpu: Some(g.id.index),
        pci_bus_id: g.id.pci_bus_id.clone(),
        mig: None,
        check,
        severity,
        message,
        fix,
    }
}

/// The PCIe link checks of one GPU (see the module docs for the idle rule).
fn link_findings(g: &GpuFacts, out: &mut Vec<Finding>) {
    let i = g.id.index;
    if let (Some(max), Some(gpu_max)) = (g.link_gen_max, g.gpu_link_gen_max) {
        if max < gpu_max {
            out.push(finding(
                g,
                Check::PcieLinkGen,
                Severity::Warning,
                format!("PCIe link can reach only gen {max} in this slot, the GPU supports gen {gpu_max} — host↔GPU copies get a fraction of the bandwidth"),
                format!("move the GPU to a gen-{gpu_max} slot or raise the slot's PCIe speed in the BIOS; check with nvidia-smi -q -i {i} -d PCIE"),
            ));
        }
    }
    if let (Some(now), Some(max), Some(util)) = (g.link_gen, g.link_gen_max, g.util) {
        if util >= BUSY_UTIL_PCT && now < max {
            out.push(finding(
                g,
                Check::PcieLinkGen,
                Severity::Warning,
                format!("PCIe link runs at gen {now} under load ({util:.0} % busy), it can reach gen {max} — the link trained down"),
                "reseat the GPU or its riser and check the cable; a link that stays slow under load is a hardware fault".into(),
            ));
        }
    }
    if let (Some(now), Some(max)) = (g.link_width, g.link_width_max) {
        if now < max {
            out.push(finding(
                g,
                Check::PcieLinkWidth,
                Severity::Warning,
                format!("PCIe link is x{now}, the GPU supports x{max} — host↔GPU copies get {now}/{max} of the bandwidth"),
                format!("reseat the GPU or use an x{max} slot; check risers and the BIOS lane split"),
            ));
        }
    }
}

/// The settings and health checks of one GPU.
fn state_findings(g: &GpuFacts, out: &mut Vec<Finding>) {
    let i = g.id.index;
    match g.state {
        DeviceState::Lost => out.push(finding(
            g,
            Check::GpuUnusable,
            Severity::Critical,
            "the GPU is lost (NVML answers GPU_IS_LOST: fallen off the bus) — a job on it fails at once".into(),
            "check dmesg | grep NVRM for XID 79; reboot the node".into(),
        )),
        DeviceState::Stalled(f) => out.push(finding(
            g,
            Check::GpuUnusable,
            Severity::Critical,
            format!("NVML call {} does not return on this GPU (driver wedged or GPU in reset) — a job on it will hang", f.symbol()),
            "check dmesg | grep NVRM for XIDs; try nvidia-smi -r -i {i} (GPU reset) or reboot the node".replace("{i}", &i.to_string()),
        )),
        DeviceState::Ok => {}
    }
    if g.persistence == Some(false) {
        out.push(finding(
            g,
            Check::PersistenceMode,
            Severity::Warning,
            "persistence mode is off — each job start pays driver init".into(),
            "enable with nvidia-smi -pm 1 (or run nvidia-persistenced)".into(),
        ));
    }
    let pending: Vec<&str> = [
        (g.remap_pending == Some(true), "a row remap"),
        (g.retired_pending == Some(true), "a page retirement"),
    ]
    .into_iter()
    .filter_map(|(on, what)| on.then_some(what))
    .collect();
    if !pending.is_empty() {
        out.push(finding(
            g,
            Check::PendingRepair,
            Severity::Critical,
            format!(
                "{} is pending — the faulty memory stays in use until the GPU is reset",
                pending.join(" and ")
            ),
            format!(
                "drain the GPU and reset it (nvidia-smi -r -i {i}) or reboot before a long job"
            ),
        ));
    }
    if let Some(action) = g.recovery_action.filter(|a| *a != 0) {
        let (what, fix) = match action {
            1 => (
                "GPU reset",
                format!("drain the GPU and reset it: nvidia-smi -r -i {i}"),
            ),
            2 => ("node reboot", "drain the node and reboot it".to_string()),
            3 => (
                "drain peer-to-peer",
                "stop jobs that use peer-to-peer (NVLink/P2P) on this GPU, then reset it"
                    .to_string(),
            ),
            4 => (
                "drain and reset",
                format!("drain the GPU and reset it: nvidia-smi -r -i {i}"),
            ),
            _ => (
                "unknown",
                "see NVIDIA's XID catalog for the recovery action".to_string(),
            ),
        };
        out.push(finding(g, Check::RecoveryAction, Severity::Critical,
            format!("NVIDIA's recovery action for this GPU is {what} ({action}) — the driver says it is not fit for work"), fix));
    }
    if let (Some(now), Some(default)) = (g.power_limit_w, g.power_default_limit_w) {
        if now + 0.5 < default {
            out.push(finding(g, Check::PowerLimit, Severity::Warning,
                format!("enforced power limit {now:.0} W is below the default {default:.0} W — the GPU throttles earlier"),
                format!("restore it with sudo nvidia-smi -i {i} -pl {default:.0}")));
        }
    }
    clock_findings(g, out);
    if let GpmStatus::Failing(error) = &g.gpm {
        out.push(finding(g, Check::GpmFailing, Severity::Warning,
            format!("GPM answers {error} — SM active, tensor and DRAM activity are absent for this GPU"),
            "another GPM client may hold it (a profiler, DCGM, another monitor): stop it, or run gpuwatch with --no-gpm; if none, check dmesg | grep NVRM".into()));
    }
    if g.ecc_enabled == Some(false) {
        out.push(finding(g, Check::EccDisabled, Severity::Warning,
            "ECC is disabled on a GPU that supports it — memory errors go undetected and corrupt results silently".into(),
            format!("enable with sudo nvidia-smi -i {i} -e 1, then reboot")));
    }
}

fn clock_findings(g: &GpuFacts, out: &mut Vec<Finding>) {
    let i = g.id.index;
    let changed: Vec<String> = [("SM", g.app_sm_clock), ("memory", g.app_mem_clock)]
        .into_iter()
        .filter_map(|(name, c)| {
            let (now, default) = c?;
            (now != default).then(|| format!("{name} {now} MHz (default {default})"))
        })
        .collect();
    if !changed.is_empty() {
        out.push(finding(
            g,
            Check::ApplicationsClocks,
            Severity::Warning,
            format!(
                "applications clocks are not the defaults: {}",
                changed.join(", ")
            ),
            format!("reset them with sudo nvidia-smi -i {i} -rac"),
        ));
    } else if g
        .clock_event_reasons
        .is_some_and(|r| r & REASON_APP_CLOCKS != 0)
    {
        out.push(finding(g, Check::LockedClocks, Severity::Warning,
            "clocks are held by a clock setting (locked clocks: clock event reason applications_clocks_setting) — the GPU cannot boost".into(),
            format!("unlock with sudo nvidia-smi -i {i} -rgc (and -rmc for memory)")));
    }
}

/// What of a GPU the job will use: all of it, or one of its MIG devices.
#[derive(Debug, Clone, Copy)]
enum Use<'a> {
    Whole,
    Mig(&'a MigSample),
}

/// The processes on GPU `g` that `is_own` does not claim, where the job will use `g`: any on
/// the GPU when it uses the whole GPU; those on the MIG device when it uses one (a process on
/// another MIG device of the GPU shares neither its memory nor its compute), and those on the
/// GPU that no MIG device of it (`mig`, every GPU's) lists: where they run is unknown, which is
/// not "elsewhere".
fn foreign_findings(
    g: &GpuFacts,
    processes: &[ProcSample],
    mig: &[MigSample],
    uses: &[(u32, Use<'_>)],
    is_own: &dyn Fn(&ProcSample) -> bool,
    out: &mut Vec<Finding>,
) {
    let mine: Vec<Use<'_>> = uses
        .iter()
        .filter(|(i, _)| *i == g.id.index)
        .map(|(_, u)| *u)
        .collect();
    let scope = if mine.iter().any(|u| matches!(u, Use::Whole)) {
        vec![Use::Whole]
    } else {
        mine
    };
    for u in scope {
        for p in processes {
            if p.gpu_index != g.id.index || is_own(p) {
                continue;
            }
            match u {
                Use::Whole => out.push(foreign(g, p, None)),
                Use::Mig(m) if m.pids.contains(&p.pid) => out.push(foreign(g, p, Some(m))),
                Use::Mig(m)
                    if !mig
                        .iter()
                        .any(|o| o.gpu_index == g.id.index && o.pids.contains(&p.pid)) =>
                {
                    out.push(unplaced(g, p, m));
                }
                Use::Mig(_) => {}
            }
        }
    }
}

/// `pid N (user, command)` of a foreign process, its command's control characters escaped.
fn who(p: &ProcSample) -> String {
    let user = p.user.as_deref().unwrap_or("an unknown user");
    let cmd = p.command.as_deref().map_or_else(String::new, |c| {
        format!(
            ", {}",
            crate::values::truncate_chars(&crate::values::escape_control(c), 60)
        )
    });
    format!("pid {} ({user}{cmd})", p.pid)
}

/// The finding of foreign process `p` on GPU `g` whose MIG device no MIG device's process list
/// gives (NVML places a process for root only on real drivers), where the job gets MIG device
/// `job`: it may run on the job's.
fn unplaced(g: &GpuFacts, p: &ProcSample, job: &MigSample) -> Finding {
    let mem = p.used_mem_bytes.map_or_else(
        || "memory".to_string(),
        |b| format!("{} MiB", b / 1_048_576),
    );
    let uuid = crate::values::truncate_chars(&crate::values::escape_control(&job.uuid), 60);
    finding(g, Check::ForeignProcess, Severity::Warning,
        format!("{} holds {mem} on this GPU, on a MIG device gpuwatch cannot place (no MIG device lists it) — it may be {} ({uuid}), the one CUDA_VISIBLE_DEVICES gives your job", who(p), crate::values::escape_control(&job.describe())),
        "see where it runs with nvidia-smi as root (its GI and CI columns), or run gpuwatch doctor as root; then wait for it, pick another MIG device, or ask its owner".into())
}

/// The finding of foreign process `p` on GPU `g`, or on its MIG device `mig`.
fn foreign(g: &GpuFacts, p: &ProcSample, mig: Option<&MigSample>) -> Finding {
    let mem = p.used_mem_bytes.map_or_else(
        || "memory".to_string(),
        |b| format!("{} MiB", b / 1_048_576),
    );
    let who = who(p);
    let Some(m) = mig else {
        return finding(g, Check::ForeignProcess, Severity::Warning,
            format!("{who} already holds {mem} on this GPU — your job would share its memory and compute"),
            "wait for it, pick another GPU with CUDA_VISIBLE_DEVICES, or ask its owner".into());
    };
    let of = m
        .mem_total_bytes
        .map_or_else(String::new, |t| format!(" of its {} MiB", t / 1_048_576));
    let uuid = crate::values::truncate_chars(&crate::values::escape_control(&m.uuid), 60);
    Finding {
        mig: Some(crate::values::escape_control(&m.describe())),
        ..finding(g, Check::ForeignProcess, Severity::Warning,
            format!("{who} already holds {mem}{of} on this MIG device ({uuid}), the one CUDA_VISIBLE_DEVICES gives your job — your job would share its memory and compute"),
            "wait for it, pick another MIG device with CUDA_VISIBLE_DEVICES=MIG-<UUID> (gpuwatch devices lists them), or ask its owner".into())
    }
}

/// The NVLink checks of one GPU: a link down (critical, naming its far end: a GPU, an NVSwitch,
/// a GPU not visible here, or an unknown device), a link below the speed of its NVLink
/// generation, or of the GPU's other links where the generation has no one speed (warning); see
/// `model::nvlink::findings`.
fn nvlink_findings(g: &GpuFacts, out: &mut Vec<Finding>) {
    let Some(n) = g.nvlink.as_ref().filter(|_| g.state == DeviceState::Ok) else {
        return;
    };
    for (critical, text) in crate::model::nvlink::findings(n) {
        let (check, severity, fix) = if critical {
            (Check::NvlinkDown, Severity::Critical,
             "check nvidia-smi nvlink -s and dmesg (XID 74); reset the GPUs (nvidia-smi -r) or drain the node for service")
        } else {
            (Check::NvlinkSpeed, Severity::Warning,
             "collectives over this link run slower; reset the GPUs, or reseat/replace the NVLink bridge or board")
        };
        // the line names the GPU already: drop the message's own `GPU N: ` prefix
        let prefix = format!("GPU {}: ", g.id.index);
        let message = text.strip_prefix(&prefix).unwrap_or(&text).to_string();
        out.push(finding(g, check, severity, message, fix.into()));
    }
}

/// Judges `inputs`; `is_own` says whether a GPU process belongs to the caller. Findings come
/// per GPU in index order, missing GPUs last.
pub fn findings(inputs: &Inputs, is_own: &dyn Fn(&ProcSample) -> bool) -> Vec<Finding> {
    let ids: Vec<DeviceId> = inputs.gpus.iter().map(|g| g.id.clone()).collect();
    // the GPUs (or MIG devices) the job will use, read as `gpuwatch devices` reads them
    let uses: Vec<(u32, Use<'_>)> = match &inputs.cuda_visible_devices {
        None => ids.iter().map(|d| (d.index, Use::Whole)).collect(),
        Some(spec) => {
            let c = cuda_visible_mig(spec, &ids, &inputs.mig);
            c.visible
                .iter()
                .zip(&c.mig)
                .filter_map(|(&pos, m)| {
                    let used = match m {
                        Some(k) => Use::Mig(inputs.mig.get(*k)?),
                        None => Use::Whole,
                    };
                    Some((ids.get(pos)?.index, used))
                })
                .collect()
        }
    };
    let mut out = Vec::new();
    for g in &inputs.gpus {
        link_findings(g, &mut out);
        nvlink_findings(g, &mut out);
        state_findings(g, &mut out);
        foreign_findings(g, &inputs.processes, &inputs.mig, &uses, is_own, &mut out);
    }
    for m in &inputs.missing {
        out.push(Finding {
            gpu: None,
            pci_bus_id: m.pci_bus_id.clone(),
            mig: None,
            check: Check::GpuMissing,
            severity: Severity::Critical,
            message: format!("{} — jobs get fewer GPUs than the machine has", missing_phrase(m)),
            fix: "check dmesg | grep NVRM and nvidia-smi -L; a reboot, reseat or RMA is usually needed".into(),
        });
    }
    out
}

fn missing_phrase(m: &MissingGpu) -> String {
    let d = m.describe();
    // `describe` starts with the bus id, which the line already names.
    match d.strip_prefix(&m.pci_bus_id) {
        Some(rest) if !m.pci_bus_id.is_empty() => rest.trim_start_matches([':', ' ']).to_string(),
        _ => d,
    }
}

/// Whether `p` is the caller's: the same user, and the process that started gpuwatch (`root`,
/// usually the shell), gpuwatch itself, or a descendant of `root` (walking `/proc` parents).
pub fn caller_owns(p: &ProcSample, my_uid: u32, root: u32) -> bool {
    if p.uid.is_some_and(|u| u != my_uid) {
        return false;
    }
    let me = std::process::id();
    let mut pid = p.pid;
    for _ in 0..256 {
        if pid == root || pid == me {
            return true;
        }
        match crate::sys::read_stat(pid) {
            Some(s) if s.ppid > 1 && s.ppid != pid => pid = s.ppid,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MissingWhy;

    fn healthy(index: u32) -> GpuFacts {
        GpuFacts {
            id: DeviceId {
                index,
                minor: Some(index),
                uuid: format!("GPU-{index}"),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
                name: "NVIDIA H100 80GB HBM3".into(),
            },
            state: DeviceState::Ok,
            util: Some(0.0),
            link_gen: Some(1), // idle: the link rests at gen 1
            link_gen_max: Some(5),
            gpu_link_gen_max: Some(5),
            link_width: Some(16),
            link_width_max: Some(16),
            persistence: Some(true),
            remap_pending: Some(false),
            retired_pending: None,
            recovery_action: Some(0),
            power_limit_w: Some(700.0),
            power_default_limit_w: Some(700.0),
            app_sm_clock: Some((1980, 1980)),
            app_mem_clock: Some((2619, 2619)),
            clock_event_reasons: Some(0x1),
            ecc_enabled: Some(true),
            gpm: GpmStatus::Active,
            nvlink: None,
        }
    }

    #[test]
    fn an_nvlink_down_is_critical_and_a_slow_one_a_warning() {
        use crate::model::nvlink::{NvlinkLink, NvlinkStatus};
        let link = |n: u32, up: bool, peer: u32, speed: u32| NvlinkLink {
            link: n,
            up,
            speed_mbps: up.then_some(speed),
            version: Some(4),
            remote_bus_id: None,
            remote_type: None,
            peer_gpu: Some(peer),
            crc_flit_errors: Some(0),
            crc_data_errors: Some(0),
            replay_errors: Some(0),
            recovery_errors: Some(0),
        };
        let mut g: Vec<GpuFacts> = (0..8).map(healthy).collect();
        g[3].nvlink = Some(NvlinkStatus {
            gpu: 3,
            time_ms: 0,
            links: vec![
                link(0, true, 2, 26_562),
                link(5, false, 5, 0),
                link(6, true, 4, 13_281),
            ],
        });
        g[4].nvlink = Some(NvlinkStatus {
            gpu: 4,
            time_ms: 0,
            links: vec![link(0, true, 5, 26_562)],
        });
        let f = findings(
            &Inputs {
                gpus: g,
                ..Inputs::default()
            },
            &|_| true,
        );
        assert_eq!(
            checks(&f),
            [(Some(3), Check::NvlinkDown), (Some(3), Check::NvlinkSpeed)]
        );
        assert_eq!(f[0].severity, Severity::Critical);
        assert!(
            f[0].line()
                .starts_with("GPU 3 (00000000:1B:00.0): NVLink 5 (to GPU 5) is down"),
            "{}",
            f[0].line()
        );
        assert_eq!(f[1].severity, Severity::Warning);
    }

    fn checks(f: &[Finding]) -> Vec<(Option<u32>, Check)> {
        f.iter().map(|f| (f.gpu, f.check)).collect()
    }

    #[test]
    fn a_healthy_idle_machine_has_no_findings() {
        let inputs = Inputs {
            gpus: (0..8).map(healthy).collect(),
            ..Inputs::default()
        };
        assert!(findings(&inputs, &|_| true).is_empty());
    }

    #[test]
    fn each_problem_is_one_finding_with_a_fix() {
        let mut g: Vec<GpuFacts> = (0..9).map(healthy).collect();
        g[0].link_gen_max = Some(4);
        g[1].link_width = Some(8);
        g[2].persistence = Some(false);
        g[3].remap_pending = Some(true);
        g[4].recovery_action = Some(2);
        g[5].power_limit_w = Some(500.0);
        g[6].app_sm_clock = Some((1410, 1980));
        g[7].clock_event_reasons = Some(0x2);
        g[8].ecc_enabled = Some(false);
        g[8].gpm = GpmStatus::Failing("In use by another client".into());
        g[1].gpm = GpmStatus::Unsupported("the GPU has no GPM".into());
        g[2].gpm = GpmStatus::Off;
        let inputs = Inputs {
            gpus: g,
            missing: vec![MissingGpu {
                pci_bus_id: "00000000:3A:00.0".into(),
                why: Some(MissingWhy::OnBus),
                ..MissingGpu::default()
            }],
            ..Inputs::default()
        };
        let f = findings(&inputs, &|_| true);
        assert_eq!(
            checks(&f),
            [
                (Some(0), Check::PcieLinkGen),
                (Some(1), Check::PcieLinkWidth),
                (Some(2), Check::PersistenceMode),
                (Some(3), Check::PendingRepair),
                (Some(4), Check::RecoveryAction),
                (Some(5), Check::PowerLimit),
                (Some(6), Check::ApplicationsClocks),
                (Some(7), Check::LockedClocks),
                (Some(8), Check::GpmFailing),
                (Some(8), Check::EccDisabled),
                (None, Check::GpuMissing),
            ]
        );
        assert!(
            f[8].message.contains("In use by another client") && f[8].fix.contains("--no-gpm"),
            "{}",
            f[8].line()
        );
        assert_eq!(
            f[2].line(),
            "GPU 2 (00000000:1A:00.0): persistence mode is off — each job start pays driver init; enable with nvidia-smi -pm 1 (or run nvidia-persistenced)"
        );
        assert!(f[4].message.contains("node reboot"), "{}", f[4].message);
        assert!(
            f[10]
                .line()
                .starts_with("GPU 00000000:3A:00.0: on the PCI bus"),
            "{}",
            f[10].line()
        );
        assert!(f.iter().all(|f| !f.fix.is_empty() && !f.message.is_empty()));
    }

    #[test]
    fn a_lost_or_wedged_gpu_is_a_critical_finding() {
        let mut g: Vec<GpuFacts> = (0..3).map(healthy).collect();
        g[1].state = DeviceState::Lost;
        g[2].state = DeviceState::Stalled(crate::model::NvmlFunction::FieldValues);
        let f = findings(
            &Inputs {
                gpus: g,
                ..Inputs::default()
            },
            &|_| true,
        );
        assert_eq!(
            checks(&f),
            [(Some(1), Check::GpuUnusable), (Some(2), Check::GpuUnusable)]
        );
        assert!(f.iter().all(|f| f.severity == Severity::Critical));
        assert!(
            f[1].message.contains("nvmlDeviceGetFieldValues"),
            "{}",
            f[1].message
        );
        assert!(f[1].fix.contains("nvidia-smi -r -i 2"), "{}", f[1].fix);
    }

    #[test]
    fn the_current_link_generation_counts_only_under_load() {
        let mut g = healthy(0);
        g.link_gen = Some(3);
        g.util = Some(10.0);
        let idle = Inputs {
            gpus: vec![g.clone()],
            ..Inputs::default()
        };
        assert!(findings(&idle, &|_| true).is_empty());
        g.util = Some(95.0);
        let busy = Inputs {
            gpus: vec![g],
            ..Inputs::default()
        };
        assert_eq!(
            checks(&findings(&busy, &|_| true)),
            [(Some(0), Check::PcieLinkGen)]
        );
    }

    #[test]
    fn foreign_processes_only_on_the_gpus_cuda_will_use() {
        let gpus: Vec<GpuFacts> = (0..4).map(healthy).collect();
        let procs = vec![
            ProcSample::compute(100, 1, "GPU-1", Some(20 << 30)),
            ProcSample::compute(200, 3, "GPU-3", Some(1 << 30)),
            ProcSample::compute(300, 1, "GPU-1", Some(1 << 30)),
        ];
        let own = |p: &ProcSample| p.pid == 300;
        let mut inputs = Inputs {
            gpus,
            processes: procs,
            ..Inputs::default()
        };
        assert_eq!(
            checks(&findings(&inputs, &own)),
            [
                (Some(1), Check::ForeignProcess),
                (Some(3), Check::ForeignProcess)
            ]
        );
        inputs.cuda_visible_devices = Some("1,2".into());
        let f = findings(&inputs, &own);
        assert_eq!(checks(&f), [(Some(1), Check::ForeignProcess)]);
        assert!(
            f[0].message.contains("pid 100") && f[0].message.contains("20480 MiB"),
            "{}",
            f[0].message
        );
        inputs.cuda_visible_devices = Some("GPU-3".to_string());
        assert_eq!(
            checks(&findings(&inputs, &own)),
            [(Some(3), Check::ForeignProcess)]
        );
    }

    /// GPU 1 of four split into seven 1g.10gb MIG devices (`MIG-k…`), a process on each of the
    /// first three: PID 100 + k.
    fn mig_inputs() -> Inputs {
        let gpus: Vec<GpuFacts> = (0..4).map(healthy).collect();
        let mig: Vec<MigSample> = (0..7)
            .map(|k| MigSample {
                gpu_uuid: "GPU-1".into(),
                uuid: format!("MIG-{k}{k}bb{k}-0000-1111-2222-33334444555{k}"),
                mem_total_bytes: Some(9728 << 20),
                pids: if k < 3 { vec![100 + k] } else { Vec::new() },
                ..MigSample::one_g(1, k)
            })
            .collect();
        let mut processes: Vec<ProcSample> = (0..3)
            .map(|k| ProcSample::compute(100 + k, 1, "GPU-1", Some(u64::from(k + 1) << 30)))
            .collect();
        processes.push(ProcSample::compute(200, 3, "GPU-3", Some(1 << 30)));
        Inputs {
            gpus,
            processes,
            mig,
            ..Inputs::default()
        }
    }

    #[test]
    fn a_mig_device_is_checked_for_the_processes_on_it_only() {
        let mut inputs = mig_inputs();
        let own = |p: &ProcSample| p.pid == 100;
        // the whole GPU: every foreign process on it, whichever MIG device
        assert_eq!(
            checks(&findings(&inputs, &own)),
            [
                (Some(1), Check::ForeignProcess),
                (Some(1), Check::ForeignProcess),
                (Some(3), Check::ForeignProcess)
            ]
        );
        // the job's MIG device has a foreign process: one finding, naming the MIG device
        let target = inputs.mig[1].clone();
        inputs.cuda_visible_devices = Some(target.uuid.clone());
        let f = findings(&inputs, &own);
        assert_eq!(checks(&f), [(Some(1), Check::ForeignProcess)]);
        assert_eq!(f[0].mig.as_deref(), Some("MIG 1g.10gb 1/8/0"));
        assert!(
            f[0].message.contains("pid 101")
                && f[0]
                    .message
                    .contains("2048 MiB of its 9728 MiB on this MIG device")
                && f[0].message.contains(&target.uuid),
            "{}",
            f[0].message
        );
        assert!(
            f[0].line()
                .starts_with("GPU 1 (00000000:19:00.0) MIG 1g.10gb 1/8/0: pid 101"),
            "{}",
            f[0].line()
        );
        assert!(f[0].fix.contains("MIG-<UUID>"), "{}", f[0].fix);
        // the legacy form names the same MIG device; a prefix does too
        for spec in [target.legacy_id(), "MIG-11bb".to_string()] {
            inputs.cuda_visible_devices = Some(spec.clone());
            let f = findings(&inputs, &own);
            assert_eq!(f.len(), 1, "{spec}: {f:?}");
            assert_eq!(f[0].mig.as_deref(), Some("MIG 1g.10gb 1/8/0"), "{spec}");
        }
        // the caller's own MIG device, an idle one: nothing (the others on the GPU are not the
        // job's); with GPU 3 beside it, GPU 3's process only
        for k in [0, 5] {
            inputs.cuda_visible_devices = Some(inputs.mig[k].uuid.clone());
            assert!(findings(&inputs, &own).is_empty(), "MIG device {k}");
        }
        inputs.cuda_visible_devices = Some(format!("{},3", inputs.mig[5].uuid));
        assert_eq!(
            checks(&findings(&inputs, &own)),
            [(Some(3), Check::ForeignProcess)]
        );
        // a second MIG device is skipped as CUDA skips it: only the first one counts
        inputs.cuda_visible_devices = Some(format!("{},{}", inputs.mig[5].uuid, target.uuid));
        assert!(findings(&inputs, &own).is_empty());
        // the GPU itself and one of its MIG devices: the whole GPU, each process once
        inputs.cuda_visible_devices = Some(format!("1,{}", target.uuid));
        let f = findings(&inputs, &own);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f.iter().all(|f| f.mig.is_none()));
        // an unknown MIG device ends the list: no GPU, no finding
        inputs.cuda_visible_devices = Some("MIG-ffff,1".into());
        assert!(findings(&inputs, &own).is_empty());
    }

    /// A foreign process on the GPU of the job's MIG device that no MIG device lists (NVML
    /// did not place it: not root on a real driver) may be on the job's: a finding saying so,
    /// not silence; one placed on another MIG device stays no finding.
    #[test]
    fn a_process_no_mig_device_places_is_reported_as_unplaced() {
        let mut inputs = mig_inputs();
        inputs
            .processes
            .push(ProcSample::compute(300, 1, "GPU-1", Some(3 << 30)));
        let own = |p: &ProcSample| p.pid == 100;
        inputs.cuda_visible_devices = Some(inputs.mig[5].uuid.clone());
        let f = findings(&inputs, &own);
        assert_eq!(checks(&f), [(Some(1), Check::ForeignProcess)], "{f:?}");
        assert_eq!(f[0].mig, None, "its MIG device is not known");
        assert!(
            f[0].message.starts_with("pid 300 (an unknown user) holds 3072 MiB on this GPU, on a MIG device gpuwatch cannot place")
                && f[0].message.contains("it may be MIG 1g.10gb 1/12/0 (MIG-55bb5"),
            "{}",
            f[0].message
        );
        // the job's own MIG device with a foreign process on it, and the unplaced one
        inputs.cuda_visible_devices = Some(inputs.mig[1].uuid.clone());
        let f = findings(&inputs, &own);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[0].message.starts_with("pid 101 ") && f[0].mig.is_some());
        assert!(f[1].message.starts_with("pid 300 ") && f[1].mig.is_none());
        // placed on another MIG device: no finding
        inputs.mig[6].pids.push(300);
        inputs.cuda_visible_devices = Some(inputs.mig[5].uuid.clone());
        assert!(findings(&inputs, &own).is_empty());
    }

    #[test]
    fn a_finding_names_its_mig_device_in_json_only_when_it_has_one() {
        let mut inputs = mig_inputs();
        inputs.cuda_visible_devices = Some(inputs.mig[2].uuid.clone());
        let f = findings(&inputs, &|_| false);
        let j = serde_json::to_value(&f).unwrap();
        assert_eq!(j[0]["mig"], "MIG 1g.10gb 1/9/0");
        inputs.cuda_visible_devices = None;
        let j = serde_json::to_value(findings(&inputs, &|_| false)).unwrap();
        assert!(j[0].get("mig").is_none(), "{j}");
    }

    #[test]
    fn the_caller_and_its_children_are_own_others_are_not() {
        let me = std::process::id();
        let parent = crate::sys::read_stat(me).unwrap().ppid;
        let uid = unsafe { libc::getuid() };
        let mut p = ProcSample::compute(me, 0, String::new(), None);
        p.uid = Some(uid);
        assert!(caller_owns(&p, uid, parent));
        p.uid = Some(uid + 1);
        assert!(!caller_owns(&p, uid, parent), "another user's");
        let init = ProcSample {
            uid: Some(uid),
            ..ProcSample::compute(1, 0, String::new(), None)
        };
        assert!(!caller_owns(&init, uid, parent), "pid 1 is nobody's child");
    }
}
