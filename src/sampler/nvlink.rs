//! A GPU's NVLinks, read on the slow path (process cadence; they change slowly): per link its
//! state (`nvmlDeviceGetNvLinkState`), the four error counters
//! (`nvmlDeviceGetNvLinkErrorCounter`), and in one field-values call the links' speeds and the
//! throughput counters. The links a GPU has and their version are found once. A link's far end
//! (`nvmlDeviceGetNvLinkRemotePciInfo_v2`, and what it is: `nvmlDeviceGetNvLinkRemoteDeviceType`)
//! is read when the link is found and again each time the link comes back up (down at the read
//! before, up now: re-cabled, reset — two calls per transition), and until it answers. A far
//! end's bus id is mapped to an NVML index through `nvmlDeviceGetHandleByPciBusId` once it
//! answers (a GPU, or not one of this machine's: an NVSwitch, a hidden GPU); a mapping that
//! failed (the peer slow or lost at that moment) is tried again once per slow round, so the peer
//! is named, and in the down-peers bitmask, once it answers. A GPU that answers NOT_SUPPORTED
//! for link 0 has no NVLink: it is never asked again and every NVLink row stays absent.
//!
//! What a driver does not give is remembered per GPU (each GPU has its own reader): an error
//! counter per link (NOT_SUPPORTED on one link leaves the others, and other GPUs, asked) — only
//! while the link stays up: a link down is asked at every read, and again once it is back up,
//! and a link that gave the counter once is never taken for one that does not (NOT_SUPPORTED
//! from it is a gap); the far end's type per GPU when the driver lacks the function (older
//! drivers: the far end is then an unknown device, not a guessed NVSwitch).
//!
//! A GPU total sums the links that give the counter; a link that gave it and misses it now
//! makes the total absent for that reading, never lower (a lower total is a counter reset to
//! Prometheus, and the next whole one a burst of errors). A link that never gave the counter and
//! gives it later (it answered NOT_SUPPORTED while down) joins the total then: the total rises by
//! that link's count.

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
    /// The far end's PCI bus id, once read.
    remote: Option<String>,
    /// The far end is to be read again (the link came back up and that read has not answered
    /// yet).
    reread: bool,
    /// The driver does not give the far end's PCI info (NOT_SUPPORTED): not asked again until
    /// the link comes back up.
    remote_unsupported: bool,
    /// Whether the link was up at the last read (at discovery: when found).
    up: bool,
    /// What the far end is, once the driver said (asked until it answers or says it cannot).
    remote_type: Option<RemoteType>,
    /// The driver will not say what the far end is (NOT_SUPPORTED for this link).
    type_unsupported: bool,
    /// Error counters this link does not give (by [`COUNTERS`] position): remembered while the
    /// link stays up, asked again at every read while it is down and once it is back up.
    unsupported: [bool; 4],
    /// Error counters this link has given (by [`COUNTERS`] position): a NOT_SUPPORTED from it
    /// later is a gap, never "unsupported" (which would take it out of the GPU total).
    gave: [bool; 4],
}

impl Known {
    /// Books the link's state at this read: a link that is down, or was down at the read
    /// before, forgets the counters it said it does not give (a driver may answer NOT_SUPPORTED
    /// for a link that is down); one that came back up has its far end read again (re-cabled,
    /// reset). Returns whether to read the far end now (the link is up): never read (unless the
    /// driver said it does not give it), or not yet read since the link came back up.
    fn observe(&mut self, up: bool) -> bool {
        if !up || !self.up {
            self.unsupported = [false; 4];
        }
        if up && !self.up {
            self.reread = true;
            self.remote_unsupported = false;
        }
        self.up = up;
        up && (self.reread || (self.remote.is_none() && !self.remote_unsupported))
    }

    /// Books an answer of `nvmlDeviceGetNvLinkErrorCounter` for counter `i` of this link: its
    /// value; NOT_SUPPORTED (or no such function) marks the counter unsupported on this link
    /// only, unless the link gave it before (then it is a gap this time, like a transient
    /// error); a transient error gives nothing this time.
    fn counter(&mut self, i: usize, answer: Result<u64, NvmlError>) -> Result<Option<u64>, Lost> {
        match answer {
            Ok(v) => {
                self.gave[i] = true;
                Ok(Some(v))
            }
            Err(
                NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => {
                self.unsupported[i] = !self.gave[i];
                Ok(None)
            }
            Err(e) => lost_or(&e).map(|()| None),
        }
    }
}

/// A GPU-level row from the links as read, each error counter summed over the links that give
/// it (see `NvlinkRead::of_counted`: a link counted whose counter is missing makes it absent).
fn row(r: NvlinkRead, known: &[Known], links: &[NvlinkLink]) -> Option<f64> {
    r.of_counted(links, |l, c| {
        known
            .iter()
            .find(|k| k.link == l.link)
            .is_none_or(|k| !k.unsupported[c])
    })
}

/// What a far end's PCI bus id maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// A GPU of this machine: its NVML index.
    Gpu(u32),
    /// Not a GPU NVML lists here: an NVSwitch, another container's GPU, a hidden one.
    Elsewhere,
    /// Not known yet: the look-up failed (the peer slow or lost then); tried again at the next
    /// slow round.
    Unmapped,
}

impl Peer {
    /// The mapping of an answer of `nvmlDeviceGetHandleByPciBusId` (and the handle's index).
    fn of(answer: Result<u32, NvmlError>) -> Peer {
        match answer {
            Ok(i) => Peer::Gpu(i),
            // a switch, or a GPU NVML does not list here (another container's, hidden)
            Err(
                NvmlError::NotFound
                | NvmlError::InvalidArg
                | NvmlError::NotSupported
                | NvmlError::NoPermission,
            ) => Peer::Elsewhere,
            // a peer that is lost or slow now: mapped at the next round
            Err(_) => Peer::Unmapped,
        }
    }

    fn gpu(self) -> Option<u32> {
        match self {
            Peer::Gpu(i) => Some(i),
            Peer::Elsewhere | Peer::Unmapped => None,
        }
    }
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
    /// Far ends looked up: PCI bus id → what it is (a look-up that failed is tried again once
    /// per slow round).
    peers: HashMap<String, Peer>,
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
            let up = match busy.call(NvmlFunction::NvLinkState, || link.is_active()) {
                Ok(up) => up,
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
            };
            // the driver answers nvmlNvlinkVersion_t (6 on an H100): kept as the generation
            let version = busy
                .call(NvmlFunction::NvLinkVersion, || link.version())
                .ok()
                .and_then(generation);
            let mut k = Known {
                link: l,
                version,
                up,
                ..Known::default()
            };
            self.far_end(busy, dev, &mut k)?;
            found.push(k);
        }
        self.links = Some(found);
        Ok(true)
    }

    /// Reads a link's far end and maps it to an NVML index (once per bus id that answers), and
    /// what it is (until the driver says; again when the link came back up: `k.reread`).
    fn far_end(&mut self, busy: &Busy, dev: &Device<'static>, k: &mut Known) -> Result<(), Lost> {
        self.far_type(busy, dev, k, k.reread)?;
        let link = dev.link_wrapper_for(k.link);
        let bus = match busy.call(NvmlFunction::NvLinkRemotePciInfo, || link.remote_pci_info()) {
            Ok(p) => p.bus_id,
            Err(
                NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => {
                k.remote_unsupported = true;
                k.reread = false;
                return Ok(());
            }
            Err(e) => return lost_or(&e),
        };
        if !self.peers.contains_key(&bus) {
            let peer = Self::look_up(busy, dev, &bus);
            self.peers.insert(bus.clone(), peer);
        }
        k.remote = Some(bus);
        k.reread = false;
        Ok(())
    }

    /// The GPU at PCI bus id `bus`, through `nvmlDeviceGetHandleByPciBusId` and its index.
    fn look_up(busy: &Busy, dev: &Device<'static>, bus: &str) -> Peer {
        Peer::of(
            busy.call(NvmlFunction::HandleByPciBusId, || {
                dev.nvml().device_by_pci_bus_id(bus)
            })
            .and_then(|d| busy.call(NvmlFunction::Index, || d.index())),
        )
    }

    /// Looks up again, once each, the far ends whose look-up failed (once per slow round).
    fn map_again(&mut self, busy: &Busy, dev: &Device<'static>) {
        for (bus, peer) in &mut self.peers {
            if *peer == Peer::Unmapped {
                *peer = Self::look_up(busy, dev, bus);
            }
        }
    }

    /// The NVML index of the GPU at a far end, when it is one of this machine's.
    fn peer(&self, bus: Option<&String>) -> Option<u32> {
        bus.and_then(|b| self.peers.get(b)).and_then(|p| p.gpu())
    }

    /// Asks what is at the far end of a link until the driver answers (it does not change while
    /// the link stays up; `again`: asked once more, the link came back up); a driver without
    /// the function is not asked again on this GPU.
    fn far_type(
        &mut self,
        busy: &Busy,
        dev: &Device<'static>,
        k: &mut Known,
        again: bool,
    ) -> Result<(), Lost> {
        if (k.remote_type.is_some() && !again) || k.type_unsupported || self.types_missing {
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
        if self.links.is_none() {
            if !self.discover(busy, dev)? {
                return Ok(None);
            }
        } else {
            self.map_again(busy, dev);
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
            if k.observe(up) {
                self.far_end(busy, dev, k)?;
            } else {
                // not answered before (a transient error): asked again
                self.far_type(busy, dev, k, false)?;
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
                peer_gpu: self.peer(k.remote.as_ref()),
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

    /// One read of link `k` as `read_links` does it: its state, then the counters it is asked
    /// (`answer(counter)`).
    fn book(
        k: &mut Known,
        up: bool,
        answer: impl Fn(usize) -> Result<u64, NvmlError>,
    ) -> NvlinkLink {
        k.observe(up);
        let mut l = link(k.link, None);
        l.up = up;
        let mut counts = [None; 4];
        for (i, c) in counts.iter_mut().enumerate() {
            if !k.unsupported[i] {
                *c = match k.counter(i, answer(i)) {
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
    }

    fn known(n: u32) -> Known {
        Known {
            link: n,
            up: true,
            remote: Some(format!("00000000:0{n}:00.0")),
            ..Known::default()
        }
    }

    /// A driver that answers NOT_SUPPORTED for the counters of a link while it is down: the
    /// link gave them before, so the GPU total is absent while it is down — never lower (a
    /// counter reset to Prometheus, then a burst of errors) — and whole again once it is back.
    #[test]
    fn a_link_that_gave_a_counter_never_lowers_the_total() {
        let mut k = [known(0), known(1)];
        let total = |k: &[Known], links: &[NvlinkLink]| row(NvlinkRead::CrcFlitErrors, k, links);
        // link 1's answer: `None` NOT_SUPPORTED
        let read = |k: &mut [Known], up1: bool, one: Option<u64>| {
            let a = book(&mut k[0], true, |_| Ok(10));
            let b = book(&mut k[1], up1, |_| one.ok_or(NvmlError::NotSupported));
            vec![a, b]
        };
        let links = read(&mut k, true, Some(5));
        assert_eq!(total(&k, &links), Some(15.0));
        for _ in 0..2 {
            let links = read(&mut k, false, None);
            assert_eq!(total(&k, &links), None, "absent, not 10");
            assert_eq!(k[1].unsupported, [false; 4]);
        }
        // up again: asked, and counted
        let links = read(&mut k, true, Some(6));
        assert_eq!(total(&k, &links), Some(16.0));
        // a NOT_SUPPORTED from it while up is a gap too: it gave the counter
        let links = read(&mut k, true, None);
        assert_eq!(total(&k, &links), None);
        let links = read(&mut k, true, Some(7));
        assert_eq!(total(&k, &links), Some(17.0));
    }

    /// A counter a link never gave: NOT_SUPPORTED while it is up is remembered (not asked again)
    /// while it stays up; a link down is asked at every read (left out of the total while it
    /// says NOT_SUPPORTED) and again once it is back up, where it may give it.
    #[test]
    fn a_counter_never_given_is_remembered_only_while_the_link_is_up() {
        let asked = std::cell::Cell::new(0);
        let mut k = known(0);
        let ns = |_: usize| {
            asked.set(asked.get() + 1);
            Err(NvmlError::NotSupported)
        };
        book(&mut k, true, ns);
        assert_eq!((k.unsupported, asked.get()), ([true; 4], 4));
        book(&mut k, true, ns);
        assert_eq!(asked.get(), 4, "remembered while up");
        // down: asked each time, left out of the total while it says NOT_SUPPORTED
        let mut other = known(1);
        for n in [8, 12] {
            let l = book(&mut k, false, ns);
            assert_eq!(asked.get(), n);
            assert_eq!(k.unsupported, [true; 4]);
            let links = [l, book(&mut other, true, |_| Ok(2))];
            let pair = [k.clone(), other.clone()];
            assert_eq!(row(NvlinkRead::CrcFlitErrors, &pair, &links), Some(2.0));
        }
        // back up: asked again, and it gives the counter now
        let l = book(&mut k, true, |_| Ok(3));
        assert_eq!(l.crc_flit_errors, Some(3));
        assert_eq!((k.unsupported, k.gave), ([false; 4], [true; 4]));
    }

    /// The far end is read when never read, again after the link comes back up (re-cabled,
    /// reset) until that read answers, and not at every read of a link that stays up.
    #[test]
    fn the_far_end_is_read_again_when_the_link_comes_back_up() {
        let mut k = known(0);
        assert!(!k.observe(true), "up, far end known");
        assert!(!k.observe(false), "down: not read");
        assert!(!k.observe(false));
        assert!(k.observe(true), "back up: read again");
        // that read failed (transient): asked again at the next read
        assert!(k.observe(true));
        k.reread = false; // answered
        assert!(!k.observe(true));
        // never read: asked while up, not while down
        let mut k = Known {
            remote: None,
            ..known(1)
        };
        assert!(k.observe(true));
        assert!(!k.observe(false));
        // a driver that does not give it: not asked again until the link comes back up
        k.remote_unsupported = true;
        assert!(!k.observe(false));
        assert!(k.observe(true));
        k.remote_unsupported = true;
        k.reread = false;
        assert!(!k.observe(true));
    }

    /// A far end whose look-up failed for a reason that passes (the peer slow, lost for now) is
    /// not taken for a device NVML does not list: it is looked up again at the next round.
    #[test]
    fn a_failed_look_up_of_the_peer_is_tried_again() {
        assert_eq!(Peer::of(Ok(5)), Peer::Gpu(5));
        assert_eq!(Peer::of(Err(NvmlError::NotFound)), Peer::Elsewhere);
        for e in [NvmlError::Timeout, NvmlError::Unknown, NvmlError::GpuLost] {
            assert_eq!(Peer::of(Err(e)), Peer::Unmapped);
        }
        let mut r = NvlinkReader::default();
        r.peers.insert("a".into(), Peer::Unmapped);
        r.peers.insert("b".into(), Peer::Gpu(3));
        assert_eq!(r.peer(Some(&"a".to_string())), None);
        assert_eq!(r.peer(Some(&"b".to_string())), Some(3));
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
