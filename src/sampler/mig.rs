//! The MIG devices of a GPU with MIG on, read on the slow path: they change only when someone
//! reconfigures the GPU, and their memory and processes no faster than the GPU's.
//!
//! Per slow read: `nvmlDeviceGetMigMode`; when MIG is on, every MIG device
//! (`nvmlDeviceGetMigDeviceHandleByIndex` up to `nvmlDeviceGetMaxMigDeviceCount`, holes skipped)
//! with its UUID (`MIG-…`), its name (which carries the profile: `NVIDIA A100-SXM4-80GB MIG
//! 1g.10gb`), its GPU and compute instance ids (`nvmlDeviceGetGpuInstanceId` /
//! `…ComputeInstanceId`, which nvml-wrapper does not wrap: called through its library table) and
//! its memory; its placement through `nvmlDeviceGetGpuInstanceById` + `nvmlGpuInstanceGetInfo`
//! where the driver allows (root on real drivers); and its own process list when the GPU's does
//! not place every process (a GPU with MIG on lists every MIG device's processes with their
//! instance ids to root; others may get nothing). A query a GPU does not support is not asked
//! again: failed MIG lookups cost real CPU (dcgm-exporter#599).
//!
//! GPM per GPU instance ([`MigGpmReader`], Hopper and later): at each slow read one
//! `nvmlGpmMigSampleGet` per GPU instance and one `nvmlGpmMetricsGet` against the instance's
//! sample of the previous slow read, so each value is the average over the process interval
//! between the two reads. On the slow path, not the tick: the MIG devices are known there, the
//! values ride with them, and a sample costs what the GPU's own does (~200 µs of driver CPU)
//! for every instance: on a GPU split 7 × 1g, 7 × 200 µs every 5 s at the daemon's process
//! cadence, 280 µs a second — 1.4 × the GPU's own GPM at its 1 s tick (200 µs a second), where
//! the tick's cadence would cost 7 × — with nothing between the reads missed (the counters
//! integrate). Only the rows a GPU instance has (`Metric::per_gpu_instance`) are kept.

use std::time::{Duration, Instant};

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, GpmSample};

use super::slot::{gpm_sample_alloc, GpmRequest, GPM_MIN_WINDOW};
use super::worker::Busy;
use crate::model::{MigGpm, MigPlacement, NvmlFunction};

/// One MIG device as read.
#[derive(Debug, Clone)]
pub(super) struct MigReading {
    pub index: u32,
    pub uuid: String,
    pub name: Option<String>,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub placement: Option<MigPlacement>,
    pub mem_used: Option<u64>,
    pub mem_total: Option<u64>,
    /// Its own process list, when it was read (the GPU's did not place every process).
    pub processes: Option<Vec<ProcessInfo>>,
    /// The GPM metrics of its GPU instance (see [`MigGpmReader`]).
    pub gpm: MigGpm,
}

/// The GPU answered GPU_IS_LOST / RESET_REQUIRED.
pub(super) struct Gone;

/// What one GPU's MIG queries support (each asked no more once it is known not to).
#[derive(Debug, Default)]
pub(super) struct MigReader {
    /// No MIG on this GPU (`nvmlDeviceGetMigMode` not supported).
    no_mig: bool,
    /// No placements (no permission, not supported, no symbol).
    no_placement: bool,
    /// No per-MIG-device process lists.
    no_procs: bool,
    /// A MIG device whose ids could not be read was logged.
    warned: bool,
    /// GPM per GPU instance.
    pub(super) gpm: MigGpmReader,
}

/// Two GPM samples allocated once and filled in turn, and which of them holds the previous
/// read's snapshot: the alternation of a GPU instance's GPM here and of the GPU's own
/// (`slot::Gpm`).
pub(super) struct SamplePair<T> {
    samples: [T; 2],
    /// The sample holding the previous read's snapshot and when it was taken (none at the first
    /// read, or after a failed one).
    prev: Option<(usize, Instant)>,
}

impl<T> SamplePair<T> {
    pub(super) fn new(samples: [T; 2]) -> SamplePair<T> {
        SamplePair {
            samples,
            prev: None,
        }
    }

    /// The sample to fill at `now`: the older one; `None` when the previous one was taken less
    /// than `min_window` before (no sample then: the next read measures from the previous one).
    pub(super) fn next(&self, now: Instant, min_window: Duration) -> Option<usize> {
        match self.prev {
            Some((_, at)) if now.saturating_duration_since(at) < min_window => None,
            Some((p, _)) => Some(1 - p),
            None => Some(0),
        }
    }

    /// Sample `k`.
    pub(super) fn sample(&self, k: usize) -> &T {
        &self.samples[k]
    }

    /// Sample `cur` was filled at `now` and is the previous one from now on; the one filled
    /// before it, to measure against (none at the first read).
    pub(super) fn filled(&mut self, cur: usize, now: Instant) -> Option<usize> {
        self.prev.replace((cur, now)).map(|(p, _)| p)
    }

    /// A read failed: the next one takes a first sample again.
    pub(super) fn forget(&mut self) {
        self.prev = None;
    }
}

/// The spacing of a device's GPM reads, for the shortest span a reading may cover: at most
/// [`GPM_MIN_WINDOW`], and half the spacing of the reads before once that is less (a scenario
/// played faster reads every few ms of wall time). The GPU's own GPM (`slot::Gpm`) uses it too.
#[derive(Debug, Default)]
pub(super) struct ReadSpacing {
    last: Option<Instant>,
    spacing: Option<Duration>,
}

impl ReadSpacing {
    /// The shortest span a reading at `now` may cover; notes this read.
    pub(super) fn min_window(&mut self, now: Instant) -> Duration {
        let before = self.spacing;
        if let Some(t) = self.last {
            self.spacing = Some(now.saturating_duration_since(t));
        }
        self.last = Some(now);
        before.map_or(GPM_MIN_WINDOW, |s| (s / 2).min(GPM_MIN_WINDOW))
    }
}

/// GPM per GPU instance on one GPU (`nvmlGpmMigSampleGet`): per instance two samples
/// allocated once and filled in turn, and one metrics request for all of them. A GPU without
/// GPM, or whose driver does not sample GPU instances, is not asked again; an instance that
/// is gone has its samples freed (all of them when MIG goes away or GPM is turned off); a
/// failing call leaves the instance's values absent and is tried again at the next read.
#[derive(Default)]
pub(super) struct MigGpmReader {
    /// `[daemon] gpm = false`, `--no-gpm`.
    pub off: bool,
    /// Whether the GPU samples its GPU instances: not known yet, yes, or no (asked no more).
    supported: Option<bool>,
    /// The GPU instances' samples.
    instances: Vec<InstanceGpm>,
    /// The metrics request (allocated at the first read that needs it).
    request: Option<GpmRequest>,
    /// The spacing of the reads (their minimum window).
    spacing: ReadSpacing,
    /// A failing call was logged (once until it answers again).
    warned: bool,
}

/// The two samples of one GPU instance.
struct InstanceGpm {
    gpu_instance_id: u32,
    /// The UUID of its (first) MIG device: a GPU instance destroyed and created again under the
    /// same id between two reads is another instance, whose counters are not the old one's.
    uuid: String,
    pair: SamplePair<GpmSample<'static>>,
}

/// `nvmlGpmMigSampleGet` of GPU instance `gi` of `dev` into an allocated sample.
fn mig_sample_get(
    dev: &Device<'static>,
    gi: u32,
    sample: &GpmSample<'static>,
) -> Result<(), NvmlError> {
    let sym = nvml_sym(dev.nvml().lib().nvmlGpmMigSampleGet.as_ref())?;
    // SAFETY: the GPU's handle and the sample belong to this library and outlive the call; the
    // sample is used by this thread only.
    nvml_try(unsafe { sym(dev.handle(), gi, sample.handle()) })
}

impl std::fmt::Debug for MigGpmReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigGpmReader")
            .field("off", &self.off)
            .field("supported", &self.supported)
            .field("instances", &self.instances.len())
            .finish_non_exhaustive()
    }
}

impl MigGpmReader {
    /// Whether this GPU's GPU instances are read (GPM per instance known to answer).
    pub(super) fn active(&self) -> bool {
        !self.off && self.supported == Some(true)
    }

    /// Forgets every instance (MIG turned off or gone, GPM turned off, the GPU lost): their
    /// samples are freed.
    pub(super) fn clear(&mut self) {
        self.instances.clear();
        self.spacing = ReadSpacing::default();
    }

    /// GPU instances whose samples are held.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.instances.len()
    }

    /// Reads the GPM metrics of each GPU instance among `devices` into their `gpm`.
    fn read(
        &mut self,
        index: u32,
        busy: &Busy,
        dev: &Device<'static>,
        devices: &mut [MigReading],
    ) -> Result<(), Gone> {
        if self.off || self.supported == Some(false) {
            // GPM turned off since: nothing of it stays allocated
            self.clear();
            return Ok(());
        }
        if self.supported.is_none() {
            match busy.call(NvmlFunction::GpmQueryDeviceSupport, || dev.gpm_support()) {
                Ok(true) => self.supported = Some(true),
                Err(e) if lost(&e) => return Err(Gone),
                Ok(false) | Err(_) => {
                    tracing::debug!("GPU {index}: no GPM per GPU instance (Hopper and later)");
                    self.supported = Some(false);
                    return Ok(());
                }
            }
        }
        // instances that are gone (or came back as others) free their samples
        self.instances.retain(|s| {
            devices
                .iter()
                .find(|d| d.gpu_instance_id == s.gpu_instance_id)
                .is_some_and(|d| d.uuid == s.uuid)
        });
        let nvml = dev.nvml();
        let now = Instant::now();
        let min_window = self.spacing.min_window(now);
        let mut gis: Vec<(u32, String)> = Vec::with_capacity(devices.len());
        for d in devices.iter() {
            if !gis.iter().any(|(g, _)| *g == d.gpu_instance_id) {
                gis.push((d.gpu_instance_id, d.uuid.clone()));
            }
        }
        for (gi, uuid) in gis {
            let pos = match self.instances.iter().position(|s| s.gpu_instance_id == gi) {
                Some(p) => p,
                None => {
                    let alloc =
                        || busy.call(NvmlFunction::GpmSampleAlloc, || gpm_sample_alloc(nvml));
                    match (alloc(), alloc()) {
                        (Ok(a), Ok(b)) => {
                            self.instances.push(InstanceGpm {
                                gpu_instance_id: gi,
                                uuid,
                                pair: SamplePair::new([a, b]),
                            });
                            self.instances.len() - 1
                        }
                        (Err(e), _) | (_, Err(e)) => {
                            if lost(&e) {
                                return Err(Gone);
                            }
                            self.failed(index, gi, &e);
                            continue;
                        }
                    }
                }
            };
            let st = &mut self.instances[pos];
            let Some(cur) = st.pair.next(now, min_window) else {
                // too soon after the last sample: none taken, the next read measures from it
                continue;
            };
            match busy.call(NvmlFunction::GpmMigSampleGet, || {
                mig_sample_get(dev, gi, st.pair.sample(cur))
            }) {
                Ok(()) => {}
                Err(e) if lost(&e) => return Err(Gone),
                Err(
                    e @ (NvmlError::NotSupported
                    | NvmlError::FunctionNotFound
                    | NvmlError::FailedToLoadSymbol(_)),
                ) => {
                    tracing::info!(
                        "GPU {index}: no GPM per GPU instance ({e}); their GPM metrics are absent"
                    );
                    self.supported = Some(false);
                    self.instances.clear();
                    self.request = None;
                    return Ok(());
                }
                Err(NvmlError::InvalidArg) => {
                    // destroyed since it was listed
                    self.instances.remove(pos);
                    continue;
                }
                Err(e) => {
                    st.pair.forget();
                    self.failed(index, gi, &e);
                    continue;
                }
            }
            let Some(p) = st.pair.filled(cur, now) else {
                continue;
            };
            let request = self.request.get_or_insert_with(GpmRequest::new);
            let got = busy.call(NvmlFunction::GpmMetricsGet, || {
                request.get(nvml, st.pair.sample(p), st.pair.sample(cur))
            });
            match got {
                Ok(()) => {
                    if self.warned {
                        self.warned = false;
                        tracing::info!("GPU {index}: GPM per GPU instance answers again");
                    }
                    // the rows a GPU instance has: the bandwidths and video engines are its GPU's
                    let mut values = MigGpm::default();
                    for (m, v) in request.answers().filter(|(m, _)| m.per_gpu_instance()) {
                        values.set(m, v);
                    }
                    for d in devices.iter_mut().filter(|d| d.gpu_instance_id == gi) {
                        d.gpm = values.clone();
                    }
                }
                Err(e) if lost(&e) => return Err(Gone),
                Err(e) => self.failed(index, gi, &e),
            }
        }
        Ok(())
    }

    /// A failing call: logged once until GPM per GPU instance answers again.
    fn failed(&mut self, index: u32, gi: u32, e: &NvmlError) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                "GPU {index}: GPM of GPU instance {gi} failed ({e}; another GPM client, or the \
                 driver in trouble): its GPM metrics are absent until it answers"
            );
        }
    }
}

fn lost(e: &NvmlError) -> bool {
    matches!(e, NvmlError::GpuLost | NvmlError::ResetRequired)
}

/// A failure that will not change by asking again.
pub(super) fn permanent(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::NoPermission
    )
}

/// `nvmlDeviceGetGpuInstanceId` or `…ComputeInstanceId` of a MIG device handle.
fn instance_id(dev: &Device<'static>, compute: bool) -> Result<u32, NvmlError> {
    let lib = dev.nvml().lib();
    let sym = if compute {
        nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?
    } else {
        nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?
    };
    let mut id: u32 = 0;
    // SAFETY: a valid MIG device handle of this library and a pointer to a live u32, per the
    // function's contract.
    nvml_try(unsafe { sym(dev.handle(), &mut id) })?;
    Ok(id)
}

/// The placement of GPU instance `gi` of `parent`.
fn placement(busy: &Busy, parent: &Device<'static>, gi: u32) -> Result<MigPlacement, NvmlError> {
    let lib = parent.nvml().lib();
    let by_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceById.as_ref())?;
    let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
    let mut instance = std::ptr::null_mut();
    busy.call(NvmlFunction::GpuInstanceById, || {
        // SAFETY: the GPU's own handle and a pointer to a live handle slot.
        nvml_try(unsafe { by_id(parent.handle(), gi, &mut instance) })
    })?;
    let mut info = std::mem::MaybeUninit::zeroed();
    busy.call(NvmlFunction::GpuInstanceGetInfo, || {
        // SAFETY: a GPU-instance handle the library just gave and a pointer to a zeroed struct
        // of the type the function writes.
        nvml_try(unsafe { get_info(instance, info.as_mut_ptr()) })
    })?;
    // SAFETY: zeroed, then written by a successful call; the struct is plain data.
    let info = unsafe { info.assume_init() };
    Ok(MigPlacement {
        start: info.placement.start,
        size: info.placement.size,
    })
}

impl MigReader {
    /// Reads the MIG devices of `dev`: `Ok(None)` when MIG is off or unknown, `Ok(Some(list))`
    /// when it is on. `gpu_procs` is the GPU's own process list (`None`: it could not be read):
    /// a MIG device's list is read only when that does not place every process.
    pub(super) fn read(
        &mut self,
        index: u32,
        busy: &Busy,
        dev: &Device<'static>,
        gpu_procs: Option<&[ProcessInfo]>,
    ) -> Result<Option<Vec<MigReading>>, Gone> {
        if self.no_mig {
            return Ok(None);
        }
        let mode = match busy.call(NvmlFunction::MigMode, || dev.mig_mode()) {
            Ok(m) => m,
            Err(e) if lost(&e) => return Err(Gone),
            Err(e) => {
                if permanent(&e) || matches!(e, NvmlError::InvalidArg) {
                    tracing::debug!("GPU {index}: no MIG ({e}); not asked again");
                    self.no_mig = true;
                    // MIG was maybe on before: its GPU instances' samples go
                    self.gpm.clear();
                }
                return Ok(None);
            }
        };
        if mode.current != 1 {
            self.gpm.clear();
            return Ok(None);
        }
        let max = busy
            .call(NvmlFunction::MaxMigDeviceCount, || dev.mig_device_count())
            .unwrap_or(7)
            .min(64);
        let own_lists = !self.no_procs
            && gpu_procs
                .is_none_or(|l| l.is_empty() || l.iter().any(|p| p.gpu_instance_id.is_none()));
        let mut out = Vec::new();
        for k in 0..max {
            let m = match busy.call(NvmlFunction::MigDeviceHandleByIndex, || {
                dev.mig_device_by_index(k)
            }) {
                Ok(m) => m,
                Err(e) if lost(&e) => return Err(Gone),
                // a hole (destroyed instance), or past the last
                Err(NvmlError::NotFound) => continue,
                Err(_) => break,
            };
            let ids = busy
                .call(NvmlFunction::GpuInstanceId, || instance_id(&m, false))
                .and_then(|gi| {
                    busy.call(NvmlFunction::ComputeInstanceId, || instance_id(&m, true))
                        .map(|ci| (gi, ci))
                });
            let uuid = busy.call(NvmlFunction::Uuid, || m.uuid());
            let (gi, ci, uuid) = match (ids, uuid) {
                (Ok((gi, ci)), Ok(uuid)) => (gi, ci, uuid),
                (Err(e), _) | (_, Err(e)) => {
                    if lost(&e) {
                        return Err(Gone);
                    }
                    if !self.warned {
                        self.warned = true;
                        tracing::warn!(
                            "GPU {index}: MIG device {k} left out: its identity cannot be read ({e})"
                        );
                    }
                    continue;
                }
            };
            let name = busy.call(NvmlFunction::Name, || m.name()).ok();
            let mem = busy.call(NvmlFunction::MemoryInfo, || m.memory_info()).ok();
            let placement = if self.no_placement {
                None
            } else {
                match placement(busy, dev, gi) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        if lost(&e) {
                            return Err(Gone);
                        }
                        if permanent(&e) {
                            tracing::debug!(
                                "GPU {index}: MIG placements not available ({e}); not asked again"
                            );
                            self.no_placement = true;
                        }
                        None
                    }
                }
            };
            let processes = if own_lists && !self.no_procs {
                match busy.call(NvmlFunction::ComputeRunningProcesses, || {
                    m.running_compute_processes()
                }) {
                    Ok(list) => Some(list),
                    Err(e) => {
                        if lost(&e) {
                            return Err(Gone);
                        }
                        if permanent(&e) {
                            self.no_procs = true;
                        }
                        None
                    }
                }
            } else {
                None
            };
            out.push(MigReading {
                index: k,
                uuid,
                name,
                gpu_instance_id: gi,
                compute_instance_id: ci,
                placement,
                mem_used: mem.as_ref().map(|m| m.used),
                mem_total: mem.as_ref().map(|m| m.total),
                processes,
                gpm: MigGpm::default(),
            });
        }
        self.gpm.read(index, busy, dev, &mut out)?;
        Ok(Some(out))
    }
}

/// The MIG devices of GPU `id` as the model holds them; each lists the processes of `procs`
/// (the GPU's, with the instance ids NVML gave them) and of its own list that run on it.
pub(super) fn samples(
    id: &crate::model::DeviceId,
    readings: Vec<MigReading>,
    procs: &[(ProcessInfo, crate::model::ProcKind)],
) -> Vec<crate::model::MigSample> {
    readings
        .into_iter()
        .map(|r| {
            let mut pids: Vec<u32> = procs
                .iter()
                .map(|(p, _)| p)
                .chain(r.processes.iter().flatten())
                .filter(|p| {
                    p.gpu_instance_id == Some(r.gpu_instance_id)
                        && p.compute_instance_id
                            .is_none_or(|ci| ci == r.compute_instance_id)
                })
                .map(|p| p.pid)
                .collect();
            // a MIG device's own list places its processes even without ids
            for p in r.processes.iter().flatten() {
                if !pids.contains(&p.pid) {
                    pids.push(p.pid);
                }
            }
            pids.sort_unstable();
            pids.dedup();
            crate::model::MigSample {
                gpu_index: id.index,
                gpu_uuid: id.uuid.clone(),
                index: r.index,
                profile: r
                    .name
                    .as_deref()
                    .and_then(crate::model::mig_profile_of_name),
                uuid: r.uuid,
                gpu_instance_id: r.gpu_instance_id,
                compute_instance_id: r.compute_instance_id,
                placement: r.placement,
                mem_used_bytes: r.mem_used,
                mem_total_bytes: r.mem_total,
                pids,
                gpm: r.gpm,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two samples in turn: the first read fills one and measures nothing, each later one fills
    /// the older and measures against the newer; a read too soon takes none; a failed read
    /// starts again.
    #[test]
    fn a_sample_pair_alternates() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut pair = SamplePair::new(["a", "b"]);
        let w = GPM_MIN_WINDOW;
        assert_eq!(pair.next(t0, w), Some(0));
        assert_eq!(pair.filled(0, t0), None, "nothing to measure against");
        assert_eq!(pair.next(t0 + ms(10), w), None, "too soon");
        let cur = pair.next(t0 + ms(100), w).expect("a sample");
        assert_eq!((cur, *pair.sample(cur)), (1, "b"));
        assert_eq!(pair.filled(cur, t0 + ms(100)), Some(0));
        assert_eq!(pair.next(t0 + ms(200), w), Some(0));
        pair.forget();
        assert_eq!(pair.next(t0 + ms(201), w), Some(0));
        assert_eq!(pair.filled(0, t0 + ms(201)), None);
    }

    /// The slow reads' own spacing sets the window once it is known: 50 ms at most, half the
    /// spacing when that is less (a scenario played fast).
    #[test]
    fn the_window_follows_the_slow_reads() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut s = ReadSpacing::default();
        assert_eq!(s.min_window(t0), GPM_MIN_WINDOW);
        assert_eq!(s.min_window(t0 + ms(5000)), GPM_MIN_WINDOW);
        assert_eq!(
            s.min_window(t0 + ms(5020)),
            GPM_MIN_WINDOW,
            "5 s apart before"
        );
        assert_eq!(s.min_window(t0 + ms(5040)), ms(10), "20 ms apart before");
        let mut r = MigGpmReader::default();
        r.spacing.min_window(t0);
        r.clear();
        assert_eq!(r.held(), 0);
        assert!(r.spacing.last.is_none(), "cleared with the samples");
    }
}
