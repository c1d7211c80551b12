//! A GPU's NVLinks, read on the slow path (process cadence; they change slowly): per link its
//! state (`nvmlDeviceGetNvLinkState`), the four error counters
//! (`nvmlDeviceGetNvLinkErrorCounter`), and in one field-values call the links' speeds and the
//! throughput counters. The links a GPU has, their version and far end
//! (`nvmlDeviceGetNvLinkRemotePciInfo_v2`, mapped to an NVML index through
//! `nvmlDeviceGetHandleByPciBusId`, and what it is: `nvmlDeviceGetNvLinkRemoteDeviceType`, read
//! once per link — it does not change) are found once, and the far end again when a link comes
//! back up. A GPU that answers NOT_SUPPORTED for link 0 has no NVLink: it is never asked again
//! and every NVLink row stays absent.
//!
//! What a driver does not give is remembered per GPU (each GPU has its own reader): an error
//! counter per link (NOT_SUPPORTED on one link leaves the others, and other GPUs, asked), the
//! far end's type per GPU when the driver lacks the function (older drivers: the far end is then
//! an unknown device, not a guessed NVSwitch).

use std::collections::HashMap;

use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN, nvmlIntNvLinkDeviceType_t,
};

use super::slot::{Lost, RATE_MIN_WINDOW_US};
use super::worker::Busy;
use crate::model::nvlink::{generation, NvlinkLink, NvlinkRead, RemoteType};
use crate::model::{MetricValues, NvmlFunction, Source, METRICS};

/// `NVML_NVLINK_MAX_LINKS`.
const MAX_LINKS: u32 = 18;
/// `NVML_FI_DEV_NVLINK_SPEED_MBPS_L0` … `_L5`, `_L6` … `_L11`, `_COMMON`.
const SPEED_L0: u32 = 84;
const SPEED_L6: u32 = 132;
const SPEED_COMMON: u32 = 90;
/// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX` (KiB, cumulative).
const THROUGHPUT_TX: u32 = 138;
const THROUGHPUT_RX: u32 = 139;
/// The error counters in the order of [`NvlinkLink`]'s fields.
const COUNTERS: [ErrorCounter; 4] = [
    ErrorCounter::DlCrcFlit,
    ErrorCounter::DlCrcData,
    ErrorCounter::DlReplay,
    ErrorCounter::DlRecovery,
];

/// The field id of link `l`'s speed, for links 0–11.
fn speed_field(l: u32) -> Option<u32> {
    match l {
        0..=5 => Some(SPEED_L0 + l),
        6..=11 => Some(SPEED_L6 + l - 6),
        _ => None,
    }
}

/// One link as found.
#[derive(Debug, Clone, Default)]
struct Known {
    link: u32,
    /// NVLink generation.
    version: Option<u32>,
    remote: Option<String>,
    peer: Option<u32>,
    /// What the far end is, once the driver said (asked until it answers or says it cannot).
    remote_type: Option<RemoteType>,
    /// The driver will not say what the far end is (NOT_SUPPORTED for this link).
    type_unsupported: bool,
    /// Error counters this link does not give (by [`COUNTERS`] position).
    unsupported: [bool; 4],
}

impl Known {
    /// Books an answer of `nvmlDeviceGetNvLinkErrorCounter` for counter `i` of this link: its
    /// value; NOT_SUPPORTED (or no such function) marks the counter unsupported on this link
    /// only; a transient error gives nothing this time.
    fn counter(&mut self, i: usize, answer: Result<u64, NvmlError>) -> Result<Option<u64>, Lost> {
        match answer {
            Ok(v) => Ok(Some(v)),
            Err(
                NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => {
                self.unsupported[i] = true;
                Ok(None)
            }
            Err(e) => lost_or(&e).map(|()| None),
        }
    }
}

/// A GPU-level row from the links as read, each error counter summed over the links that give
/// it (see `NvlinkRead::of_counted`).
fn row(r: NvlinkRead, known: &[Known], links: &[NvlinkLink]) -> Option<f64> {
    r.of_counted(links, |l, c| {
        known
            .iter()
            .find(|k| k.link == l.link)
            .is_none_or(|k| !k.unsupported[c])
    })
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType`, through the symbol table: nvml-wrapper 0.13's
/// `NvLink::remote_device_type` passes the driver a temporary and always returns `Unknown`.
fn remote_device_type(dev: &Device<'static>, link: u32) -> Result<RemoteType, NvmlError> {
    let sym = nvml_sym(
        dev.nvml()
            .lib()
            .nvmlDeviceGetNvLinkRemoteDeviceType
            .as_ref(),
    )?;
    let mut kind: nvmlIntNvLinkDeviceType_t =
        nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    // SAFETY: the device's own handle from this library and a pointer to a live
    // nvmlIntNvLinkDeviceType_t, per the function's contract.
    nvml_try(unsafe { sym(dev.handle(), link, &mut kind) })?;
    Ok(RemoteType::from_nvml(kind))
}

/// The NVLink state of one GPU's slow slot.
#[derive(Default)]
pub(super) struct NvlinkReader {
    /// The GPU's links once found (`Some(empty)`: no NVLink).
    links: Option<Vec<Known>>,
    /// The driver lacks `nvmlDeviceGetNvLinkRemoteDeviceType` (FUNCTION_NOT_FOUND, or no such
    /// symbol): never asked again on this GPU.
    types_missing: bool,
    /// The field-values call gave nothing worth asking again.
    fields_unsupported: bool,
    /// The last throughput reading: KiB sent plus received, and when (µs).
    prev_kib: Option<(u64, i64)>,
    /// The last bandwidth computed (bytes/s), given again while the window is too short.
    last_bandwidth: Option<f64>,
    /// Far ends already mapped: PCI bus id → NVML index (`None`: not a GPU, e.g. an NVSwitch).
    peers: HashMap<String, Option<u32>>,
}

/// A failed NVLink call: the GPU is lost, or this read gives nothing (transient).
fn lost_or(e: &NvmlError) -> Result<(), Lost> {
    match e {
        NvmlError::GpuLost | NvmlError::ResetRequired => Err(Lost),
        _ => Ok(()),
    }
}

impl NvlinkReader {
    /// Whether the GPU is known to have no NVLink.
    pub(super) fn absent(&self) -> bool {
        self.links.as_ref().is_some_and(Vec::is_empty)
    }

    /// Finds the GPU's links: those that answer `nvmlDeviceGetNvLinkState` (NOT_SUPPORTED for
    /// link 0: no NVLink; INVALID_ARGUMENT: past the last link).
    fn discover(&mut self, busy: &Busy, dev: &Device<'static>) -> Result<bool, Lost> {
        let mut found = Vec::new();
        for l in 0..MAX_LINKS {
            let link = dev.link_wrapper_for(l);
            match busy.call(NvmlFunction::NvLinkState, || link.is_active()) {
                Ok(_) => {}
                Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) if l == 0 => {
                    self.links = Some(Vec::new());
                    return Ok(false);
                }
                Err(NvmlError::InvalidArg) => break,
                Err(NvmlError::NotSupported) => continue,
                Err(e) => {
                    lost_or(&e)?;
                    return Ok(false);
                }
            }
            // the driver answers nvmlNvlinkVersion_t (6 on an H100): kept as the generation
            let version = busy
                .call(NvmlFunction::NvLinkVersion, || link.version())
                .ok()
                .and_then(generation);
            let mut k = Known {
                link: l,
                version,
                ..Known::default()
            };
            self.far_end(busy, dev, &mut k)?;
            found.push(k);
        }
        self.links = Some(found);
        Ok(true)
    }

    /// Reads a link's far end and maps it to an NVML index (once per bus id), and what it is
    /// (once per link).
    fn far_end(&mut self, busy: &Busy, dev: &Device<'static>, k: &mut Known) -> Result<(), Lost> {
        self.far_type(busy, dev, k)?;
        let link = dev.link_wrapper_for(k.link);
        let bus = match busy.call(NvmlFunction::NvLinkRemotePciInfo, || link.remote_pci_info()) {
            Ok(p) => p.bus_id,
            Err(e) => return lost_or(&e),
        };
        if !self.peers.contains_key(&bus) {
            let peer = busy
                .call(NvmlFunction::HandleByPciBusId, || {
                    dev.nvml().device_by_pci_bus_id(bus.as_str())
                })
                .and_then(|d| busy.call(NvmlFunction::Index, || d.index()));
            match peer {
                Ok(i) => {
                    self.peers.insert(bus.clone(), Some(i));
                }
                // a switch, or a GPU NVML does not list here (another container's, hidden)
                Err(
                    NvmlError::NotFound
                    | NvmlError::InvalidArg
                    | NvmlError::NotSupported
                    | NvmlError::NoPermission,
                ) => {
                    self.peers.insert(bus.clone(), None);
                }
                // a peer that is lost or slow now: mapped at the next read
                Err(_) => {}
            }
        }
        k.peer = self.peers.get(&bus).copied().flatten();
        k.remote = Some(bus);
        Ok(())
    }

    /// Asks what is at the far end of a link until the driver answers (it does not change);
    /// a driver without the function is not asked again on this GPU.
    fn far_type(&mut self, busy: &Busy, dev: &Device<'static>, k: &mut Known) -> Result<(), Lost> {
        if k.remote_type.is_some() || k.type_unsupported || self.types_missing {
            return Ok(());
        }
        match busy.call(NvmlFunction::NvLinkRemoteDeviceType, || {
            remote_device_type(dev, k.link)
        }) {
            Ok(t) => k.remote_type = Some(t),
            Err(NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)) => {
                self.types_missing = true;
            }
            Err(NvmlError::NotSupported) => k.type_unsupported = true,
            Err(e) => lost_or(&e)?,
        }
        Ok(())
    }

    /// Reads the links into `values` (the NVLink rows) and returns them; `None` without NVLink
    /// or when the GPU did not answer this time.
    pub(super) fn read(
        &mut self,
        busy: &Busy,
        dev: &Device<'static>,
        values: &mut MetricValues,
    ) -> Result<Option<Vec<NvlinkLink>>, Lost> {
        if self.links.is_none() && !self.discover(busy, dev)? {
            return Ok(None);
        }
        let mut known = match self.links.take() {
            Some(k) if !k.is_empty() => k,
            other => {
                self.links = other;
                return Ok(None);
            }
        };
        let out = self.read_links(busy, dev, &mut known, values);
        self.links = Some(known);
        out
    }

    fn read_links(
        &mut self,
        busy: &Busy,
        dev: &Device<'static>,
        known: &mut [Known],
        values: &mut MetricValues,
    ) -> Result<Option<Vec<NvlinkLink>>, Lost> {
        let mut links = Vec::with_capacity(known.len());
        for k in known.iter_mut() {
            let link = dev.link_wrapper_for(k.link);
            let up = match busy.call(NvmlFunction::NvLinkState, || link.is_active()) {
                Ok(up) => up,
                Err(e) => {
                    lost_or(&e)?;
                    return Ok(None);
                }
            };
            if up && k.remote.is_none() {
                self.far_end(busy, dev, k)?;
            } else {
                // not answered at discovery (a transient error): asked again
                self.far_type(busy, dev, k)?;
            }
            let mut counts = [None; 4];
            for (i, c) in COUNTERS.iter().enumerate() {
                if k.unsupported[i] {
                    continue;
                }
                let answer = busy.call(NvmlFunction::NvLinkErrorCounter, || link.error_counter(*c));
                counts[i] = k.counter(i, answer)?;
            }
            links.push(NvlinkLink {
                link: k.link,
                up,
                speed_mbps: None,
                version: k.version,
                remote_bus_id: k.remote.clone(),
                remote_type: k.remote_type,
                peer_gpu: k.peer,
                crc_flit_errors: counts[0],
                crc_data_errors: counts[1],
                replay_errors: counts[2],
                recovery_errors: counts[3],
            });
        }
        let bandwidth = self.read_fields(busy, dev, &mut links)?;
        for d in METRICS {
            if let Source::Nvlink(r) = d.source {
                let v = match r {
                    NvlinkRead::Bandwidth => bandwidth,
                    r => row(r, known, &links),
                };
                values.set(d.id, v);
            }
        }
        Ok(Some(links))
    }

    /// One field-values call: the links' speeds (0–11 per link, the others the common speed)
    /// and the throughput counters; returns the bandwidth (bytes/s) since the last reading at
    /// least [`RATE_MIN_WINDOW_US`] before (a reading sooner than that gives the last one again).
    fn read_fields(
        &mut self,
        busy: &Busy,
        dev: &Device<'static>,
        links: &mut [NvlinkLink],
    ) -> Result<Option<f64>, Lost> {
        if self.fields_unsupported {
            return Ok(None);
        }
        let mut ids: Vec<FieldId> = links
            .iter()
            .filter_map(|l| speed_field(l.link))
            .map(FieldId)
            .collect();
        ids.extend([SPEED_COMMON, THROUGHPUT_TX, THROUGHPUT_RX].map(FieldId));
        let samples = match busy.call(NvmlFunction::FieldValues, || dev.field_values_for(&ids)) {
            Ok(s) => s,
            Err(e) => {
                if matches!(
                    e,
                    NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)
                ) {
                    self.fields_unsupported = true;
                }
                lost_or(&e)?;
                return Ok(None);
            }
        };
        let now_us = crate::sys::now_ms() * 1000;
        let mut got: HashMap<u32, u64> = HashMap::new();
        for (id, s) in ids.iter().zip(samples) {
            let v = match s.and_then(|s| s.value) {
                Ok(SampleValue::U32(v)) => u64::from(v),
                Ok(SampleValue::U64(v)) => v,
                Ok(SampleValue::I64(v)) => u64::try_from(v).unwrap_or(0),
                Ok(SampleValue::F64(v)) if v >= 0.0 => v as u64,
                _ => continue,
            };
            got.insert(id.0, v);
        }
        let common = got.get(&SPEED_COMMON).copied().filter(|s| *s > 0);
        for l in links.iter_mut().filter(|l| l.up) {
            let speed = speed_field(l.link)
                .and_then(|f| got.get(&f).copied())
                .or(common)
                .filter(|s| *s > 0);
            l.speed_mbps = speed.and_then(|s| u32::try_from(s).ok());
        }
        let (Some(tx), Some(rx)) = (got.get(&THROUGHPUT_TX), got.get(&THROUGHPUT_RX)) else {
            return Ok(None);
        };
        let kib = tx.saturating_add(*rx);
        if let Some((p, pt)) = self.prev_kib {
            if kib >= p && now_us >= pt && now_us - pt < RATE_MIN_WINDOW_US {
                return Ok(self.last_bandwidth);
            }
        }
        let Some((p, pt)) = self.prev_kib.replace((kib, now_us)) else {
            return Ok(None);
        };
        let dt = (now_us - pt) as f64 / 1e6;
        self.last_bandwidth = (kib >= p && dt > 0.0).then(|| (kib - p) as f64 * 1024.0 / dt);
        Ok(self.last_bandwidth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speed_fields_cover_links_0_to_11() {
        assert_eq!(speed_field(0), Some(84));
        assert_eq!(speed_field(5), Some(89));
        assert_eq!(speed_field(6), Some(132));
        assert_eq!(speed_field(11), Some(137));
        assert_eq!(speed_field(12), None);
    }

    fn link(n: u32, crc: Option<u64>) -> NvlinkLink {
        NvlinkLink {
            link: n,
            up: true,
            speed_mbps: Some(26_562),
            version: Some(4),
            remote_bus_id: None,
            remote_type: Some(RemoteType::Switch),
            peer_gpu: None,
            crc_flit_errors: crc,
            crc_data_errors: crc,
            replay_errors: crc,
            recovery_errors: crc,
        }
    }

    /// A mixed box: GPU 0's driver gives no NVLink error counters (NOT_SUPPORTED on every
    /// link), GPU 1's does, except CRC data on its link 1. Each GPU's reader books its own
    /// answers per link: GPU 0's rows are absent, GPU 1's are there — CRC data summed over the
    /// links that give it — and a transient error is a gap, not "unsupported".
    #[test]
    fn unsupported_counters_are_per_gpu_and_per_link() {
        let mut gpu0: Vec<Known> = (0..2)
            .map(|l| Known {
                link: l,
                ..Known::default()
            })
            .collect();
        let mut gpu1 = gpu0.clone();
        let read = |known: &mut [Known], answer: &dyn Fn(u32, usize) -> Result<u64, NvmlError>| {
            known
                .iter_mut()
                .map(|k| {
                    let mut l = link(k.link, None);
                    let mut counts = [None; 4];
                    for (i, c) in counts.iter_mut().enumerate() {
                        if !k.unsupported[i] {
                            *c = match k.counter(i, answer(k.link, i)) {
                                Ok(v) => v,
                                Err(Lost) => panic!("not lost"),
                            };
                        }
                    }
                    [
                        l.crc_flit_errors,
                        l.crc_data_errors,
                        l.replay_errors,
                        l.recovery_errors,
                    ] = counts;
                    l
                })
                .collect::<Vec<_>>()
        };
        let links0 = read(&mut gpu0, &|_, _| Err(NvmlError::NotSupported));
        let links1 = read(&mut gpu1, &|l, i| {
            if l == 1 && i == 1 {
                Err(NvmlError::NotSupported)
            } else {
                Ok(10 + u64::from(l))
            }
        });
        assert_eq!(row(NvlinkRead::CrcFlitErrors, &gpu0, &links0), None);
        assert_eq!(row(NvlinkRead::CrcFlitErrors, &gpu1, &links1), Some(21.0));
        assert_eq!(row(NvlinkRead::CrcDataErrors, &gpu1, &links1), Some(10.0));
        assert!(gpu0.iter().all(|k| k.unsupported == [true; 4]));
        assert_eq!(gpu1[0].unsupported, [false; 4]);
        assert_eq!(gpu1[1].unsupported, [false, true, false, false]);
        // a transient error: a gap in the total this time, asked again next time
        let links1 = read(&mut gpu1, &|l, _| {
            if l == 0 {
                Err(NvmlError::Timeout)
            } else {
                Ok(11)
            }
        });
        assert_eq!(row(NvlinkRead::CrcFlitErrors, &gpu1, &links1), None);
        assert_eq!(gpu1[0].unsupported, [false; 4]);
        assert!(matches!(
            gpu1[0].clone().counter(0, Err(NvmlError::GpuLost)),
            Err(Lost)
        ));
    }

    #[test]
    fn every_nvlink_row_is_set_by_the_reader() {
        // Bandwidth comes from the throughput counters, every other row from the links.
        let rows: Vec<NvlinkRead> = METRICS
            .iter()
            .filter_map(|d| match d.source {
                Source::Nvlink(r) => Some(r),
                _ => None,
            })
            .collect();
        assert!(rows.contains(&NvlinkRead::Bandwidth));
        assert!(rows.contains(&NvlinkRead::LinksDown));
        assert!(rows.contains(&NvlinkRead::DownPeers));
        assert_eq!(rows.len(), 7);
    }
}
