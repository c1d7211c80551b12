//! A GPU's NVLinks, read on the slow path (process cadence; they change slowly): per link its
//! state (`nvmlDeviceGetNvLinkState`), the four error counters
//! (`nvmlDeviceGetNvLinkErrorCounter`), and in one field-values call the links' speeds and the
//! throughput counters. The links a GPU has, their version and far end
//! (`nvmlDeviceGetNvLinkRemotePciInfo_v2`, mapped to an NVML index through
//! `nvmlDeviceGetHandleByPciBusId`) are found once, and the far end again when a link comes back
//! up. A GPU that answers NOT_SUPPORTED for link 0 has no NVLink: it is never asked again and
//! every NVLink row stays absent.

use std::collections::HashMap;

use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Device;

use super::slot::{Lost, RATE_MIN_WINDOW_US};
use super::worker::Busy;
use crate::model::nvlink::{NvlinkLink, NvlinkRead};
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
#[derive(Debug, Clone)]
struct Known {
    link: u32,
    version: Option<u32>,
    remote: Option<String>,
    peer: Option<u32>,
}

/// The NVLink state of one GPU's slow slot.
#[derive(Default)]
pub(super) struct NvlinkReader {
    /// The GPU's links once found (`Some(empty)`: no NVLink).
    links: Option<Vec<Known>>,
    /// Error counters the GPU does not give (by [`COUNTERS`] position).
    counters_unsupported: [bool; 4],
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
            let version = busy
                .call(NvmlFunction::NvLinkVersion, || link.version())
                .ok();
            let mut k = Known {
                link: l,
                version,
                remote: None,
                peer: None,
            };
            self.far_end(busy, dev, &mut k)?;
            found.push(k);
        }
        self.links = Some(found);
        Ok(true)
    }

    /// Reads a link's far end and maps it to an NVML index (once per bus id).
    fn far_end(&mut self, busy: &Busy, dev: &Device<'static>, k: &mut Known) -> Result<(), Lost> {
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
                Err(NvmlError::NotFound | NvmlError::InvalidArg | NvmlError::NotSupported) => {
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
            }
            let mut counts = [None; 4];
            for (i, c) in COUNTERS.iter().enumerate() {
                if self.counters_unsupported[i] {
                    continue;
                }
                match busy.call(NvmlFunction::NvLinkErrorCounter, || link.error_counter(*c)) {
                    Ok(v) => counts[i] = Some(v),
                    Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
                        self.counters_unsupported[i] = true;
                    }
                    Err(e) => lost_or(&e)?,
                }
            }
            links.push(NvlinkLink {
                link: k.link,
                up,
                speed_mbps: None,
                version: k.version,
                remote_bus_id: k.remote.clone(),
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
                    r => r.of(&links),
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
