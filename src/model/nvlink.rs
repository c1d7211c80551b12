//! NVLink as plain data: what the per-link reads give ([`NvlinkLink`]), the GPU-level metric
//! rows they feed ([`NvlinkRead`], summed over the links) and the judgements `status` and
//! `doctor` make of them (a link down, a link below its speed).
//!
//! The sampler reads the links on its slow path (process cadence): per link its state, the four
//! error counters and, where the driver gives them, its speed and far end (its PCI bus id, the
//! GPU of this machine it is, and what kind of device it is: [`RemoteType`]). A GPU without
//! NVLink (PCIe boards, consumer GPUs) has no links, and every NVLink row is absent, never 0.
//! Rules see each GPU's links as last read ([`NvlinkView`]: `gpu.nvlinks`).

use serde::{Deserialize, Serialize};

/// A GPU-level NVLink row of the metric table, computed from the GPU's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NvlinkRead {
    /// CRC flit errors, summed over the links (`NVML_NVLINK_ERROR_DL_CRC_FLIT`).
    CrcFlitErrors,
    /// CRC data errors, summed over the links (`NVML_NVLINK_ERROR_DL_CRC_DATA`).
    CrcDataErrors,
    /// Replay errors, summed over the links (`NVML_NVLINK_ERROR_DL_REPLAY`).
    ReplayErrors,
    /// Recovery errors, summed over the links (`NVML_NVLINK_ERROR_DL_RECOVERY`).
    RecoveryErrors,
    /// Data sent plus received per second, every link (rate of the throughput counters).
    Bandwidth,
    /// Links that are down.
    LinksDown,
    /// The GPUs at the far end of the links that are down, as a bitmask of NVML indexes.
    DownPeers,
}

impl NvlinkRead {
    /// Where the number comes from, in words (for the docs).
    pub fn describe(self) -> &'static str {
        match self {
            NvlinkRead::CrcFlitErrors => {
                "nvmlDeviceGetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_CRC_FLIT) summed over the links"
            }
            NvlinkRead::CrcDataErrors => {
                "nvmlDeviceGetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_CRC_DATA) summed over the links"
            }
            NvlinkRead::ReplayErrors => {
                "nvmlDeviceGetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_REPLAY) summed over the links"
            }
            NvlinkRead::RecoveryErrors => {
                "nvmlDeviceGetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_RECOVERY) summed over the links"
            }
            NvlinkRead::Bandwidth => {
                "rate of nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX + _RX) × 1024"
            }
            NvlinkRead::LinksDown => "nvmlDeviceGetNvLinkState per link: links not active",
            NvlinkRead::DownPeers => {
                "nvmlDeviceGetNvLinkRemotePciInfo_v2 of the links down, mapped to NVML indexes"
            }
        }
    }

    /// The error counter this row sums (its position in [`NvlinkLink::counters`]).
    pub fn counter(self) -> Option<usize> {
        match self {
            NvlinkRead::CrcFlitErrors => Some(0),
            NvlinkRead::CrcDataErrors => Some(1),
            NvlinkRead::ReplayErrors => Some(2),
            NvlinkRead::RecoveryErrors => Some(3),
            _ => None,
        }
    }

    /// This row's value from a GPU's links (`None` without links, or when no link gave it).
    /// [`NvlinkRead::Bandwidth`] is a rate the reader computes; it is not derived here.
    pub fn of(self, links: &[NvlinkLink]) -> Option<f64> {
        self.of_counted(links, |_, _| true)
    }

    /// [`NvlinkRead::of`] where an error counter is summed over the links `counts(link,
    /// counter)` says give it (the driver answered NOT_SUPPORTED for the others: they are left
    /// out of the total, not a gap in it); `None` when no link counts.
    pub fn of_counted(
        self,
        links: &[NvlinkLink],
        counts: impl Fn(&NvlinkLink, usize) -> bool,
    ) -> Option<f64> {
        if links.is_empty() {
            return None;
        }
        if let Some(c) = self.counter() {
            let mine: Vec<&NvlinkLink> = links.iter().filter(|l| counts(l, c)).collect();
            if mine.is_empty() {
                return None;
            }
            // saturating: a driver's counters near u64::MAX on two links must not overflow (a
            // panic in a debug build, a wrapped small total otherwise).
            // A total needs every link that gives the counter: one link's counter missing this
            // time (a transient error) would make the total drop, and the next whole reading
            // look like a burst of new errors.
            let all: Option<Vec<u64>> = mine.iter().map(|l| l.counters()[c]).collect();
            return all.map(|v| v.iter().fold(0u64, |a, b| a.saturating_add(*b)) as f64);
        }
        match self {
            NvlinkRead::CrcFlitErrors
            | NvlinkRead::CrcDataErrors
            | NvlinkRead::ReplayErrors
            | NvlinkRead::RecoveryErrors
            | NvlinkRead::Bandwidth => None,
            NvlinkRead::LinksDown => Some(links.iter().filter(|l| !l.up).count() as f64),
            NvlinkRead::DownPeers => Some(
                links
                    .iter()
                    .filter(|l| !l.up)
                    .filter_map(|l| l.peer_gpu)
                    .filter(|p| *p < 53)
                    .fold(0u64, |m, p| m | (1 << p)) as f64,
            ),
        }
    }
}

/// What is at the far end of a link, as `nvmlDeviceGetNvLinkRemoteDeviceType` says
/// (`nvmlIntNvLinkDeviceType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteType {
    /// A GPU (`NVML_NVLINK_DEVICE_TYPE_GPU`, 0): a GPU-GPU link (NVLink bridge, DGX-1 mesh).
    Gpu,
    /// An IBM POWER CPU's NVLink port (`…_IBMNPU`, 1).
    IbmNpu,
    /// An NVSwitch (`…_SWITCH`, 2): HGX/DGX boards, where no link goes to a GPU directly.
    Switch,
    /// The driver does not know (`…_UNKNOWN`, 0xFF, or any other answer).
    Unknown,
}

impl RemoteType {
    /// The type of an `nvmlIntNvLinkDeviceType_t` value.
    pub fn from_nvml(v: u32) -> RemoteType {
        match v {
            0 => RemoteType::Gpu,
            1 => RemoteType::IbmNpu,
            2 => RemoteType::Switch,
            _ => RemoteType::Unknown,
        }
    }

    /// `gpu`, `ibm_npu`, `switch` or `unknown` (as in `status --json` and `gpu.nvlinks`).
    pub fn as_str(self) -> &'static str {
        match self {
            RemoteType::Gpu => "gpu",
            RemoteType::IbmNpu => "ibm_npu",
            RemoteType::Switch => "switch",
            RemoteType::Unknown => "unknown",
        }
    }
}

/// The NVLink generation of an `nvmlDeviceGetNvLinkVersion` answer. Drivers answer
/// `nvmlNvlinkVersion_t`, not the generation (open-mpi/hwloc#658: an A100 answers 5): 1 `1_0`,
/// 2 `2_0`, 3 `2_2`, 4 `3_0`, 5 `3_1`, 6 `4_0`, 7 `5_0`; `None` for anything else.
pub fn generation(nvml_version: u32) -> Option<u32> {
    match nvml_version {
        1 => Some(1),
        2 | 3 => Some(2),
        4 | 5 => Some(3),
        6 => Some(4),
        7 => Some(5),
        _ => None,
    }
}

/// The speed (MB/s, each way) every link of an NVLink generation runs at when trained at full
/// speed, where the generation has one: 2 (V100) 25,781; 4 (H100, H200, GH200) 26,562; 5 (B200,
/// GB200) 53,125 — what `nvidia-smi nvlink -s` shows. `None` for 1 and 3: an A100 runs
/// 25,000 MB/s, GA102 boards' bridges (RTX 3090, A6000) 14,062, and both answer version 5.
pub fn full_speed_mbps(generation: u32) -> Option<u32> {
    match generation {
        2 => Some(25_781),
        4 => Some(26_562),
        5 => Some(53_125),
        _ => None,
    }
}

/// One NVLink of a GPU as last read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvlinkLink {
    /// Link number (0 … 17).
    pub link: u32,
    /// Whether the link is active.
    pub up: bool,
    /// The speed it runs at, MB/s (links 0–11: per-link field; else the speed the GPU's links
    /// share, `NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mbps: Option<u32>,
    /// NVLink generation (1–5; see [`generation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// PCI bus id of the far end (a GPU or an NVSwitch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_bus_id: Option<String>,
    /// What the far end is (`None`: not known — a driver without
    /// `nvmlDeviceGetNvLinkRemoteDeviceType`, or it did not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_type: Option<RemoteType>,
    /// NVML index of the GPU at the far end, when it is a GPU of this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_gpu: Option<u32>,
    /// Error counters (cumulative since the driver loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc_flit_errors: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc_data_errors: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_errors: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_errors: Option<u64>,
}

impl NvlinkLink {
    /// The four error counters: CRC flit, CRC data, replay, recovery.
    pub fn counters(&self) -> [Option<u64>; 4] {
        [
            self.crc_flit_errors,
            self.crc_data_errors,
            self.replay_errors,
            self.recovery_errors,
        ]
    }

    /// What is at the far end, in words: `GPU 5` (a GPU of this machine), `NVSwitch
    /// 00000000:05:00.0`, `GPU 00000000:9A:00.0 (not visible to gpuwatch)` (a GPU NVML does
    /// not list here: another container's, or hidden), `IBM NPU …`, or `unknown device …` when
    /// the driver does not say (it lacks `nvmlDeviceGetNvLinkRemoteDeviceType`): never a guess.
    pub fn far_end(&self) -> String {
        let bus = |what: &str| match &self.remote_bus_id {
            Some(b) => format!("{what} {b}"),
            None => what.to_string(),
        };
        match (self.peer_gpu, self.remote_type) {
            (Some(p), _) => format!("GPU {p}"),
            (None, Some(RemoteType::Switch)) => bus("NVSwitch"),
            (None, Some(RemoteType::Gpu)) => format!("{} (not visible to gpuwatch)", bus("GPU")),
            (None, Some(RemoteType::IbmNpu)) => bus("IBM NPU"),
            (None, Some(RemoteType::Unknown) | None) => bus("unknown device"),
        }
    }

    /// The speed this link should run at: its generation's full speed where that is known
    /// ([`full_speed_mbps`]).
    pub fn full_speed_mbps(&self) -> Option<u32> {
        self.version.and_then(full_speed_mbps)
    }
}

/// A GPU's links as last read, and when (UTC ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvlinkStatus {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// When the links were read.
    pub time_ms: i64,
    pub links: Vec<NvlinkLink>,
}

/// A GPU's links as rules see them (`gpu.nvlinks`): the newest reading and, per link, how much
/// each error counter rose since the reading before.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NvlinkView {
    /// When the links were read, UTC ms.
    pub time_ms: i64,
    pub links: Vec<NvlinkLink>,
    /// Seconds since the reading before (`None`: the first reading).
    pub interval_s: Option<f64>,
    /// Per link (in the order of `links`): the rise of [`NvlinkLink::counters`] since the
    /// reading before (`None`: no reading before, a counter missing in either, or one that went
    /// down — the driver reloaded).
    pub deltas: Vec<[Option<u64>; 4]>,
}

impl NvlinkView {
    /// The view of reading `s`, following `prev` (the view of the reading before, if any).
    pub fn next(prev: Option<&NvlinkView>, s: &NvlinkStatus) -> NvlinkView {
        let prev = prev.filter(|p| p.time_ms < s.time_ms);
        let deltas = s
            .links
            .iter()
            .map(|l| {
                let before = prev.and_then(|p| p.links.iter().find(|b| b.link == l.link));
                let now = l.counters();
                let was = before.map(NvlinkLink::counters);
                std::array::from_fn(|i| {
                    let (n, b) = (now[i]?, was?[i]?);
                    n.checked_sub(b)
                })
            })
            .collect();
        NvlinkView {
            time_ms: s.time_ms,
            links: s.links.clone(),
            #[expect(clippy::cast_precision_loss, reason = "ms between two readings")]
            interval_s: prev.map(|p| (s.time_ms - p.time_ms) as f64 / 1000.0),
            deltas,
        }
    }
}

/// A finding about a GPU's links: `(severity is critical, text)`. A link down is critical; a
/// link up below the speed it should run at is degraded (a warning). The speed it should run at
/// is its NVLink generation's full speed where the generation has one ([`full_speed_mbps`]:
/// every NVLink 4 link of an H100 runs 26,562 MB/s, so a board whose links all trained lower is
/// found too), else the fastest among the GPU's links. When every link runs below its
/// generation's speed, one finding says so for all of them.
pub fn findings(s: &NvlinkStatus) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    for l in s.links.iter().filter(|l| !l.up) {
        out.push((
            true,
            format!(
                "GPU {}: NVLink {} (to {}) is down: peer-to-peer traffic falls back to slower paths or NCCL fails",
                s.gpu,
                l.link,
                l.far_end()
            ),
        ));
    }
    let up: Vec<&NvlinkLink> = s.links.iter().filter(|l| l.up).collect();
    let fastest = up.iter().filter_map(|l| l.speed_mbps).max();
    // (link, its speed, the speed it should run at, whether that is its generation's)
    let slow: Vec<(&NvlinkLink, u32, u32, bool)> = up
        .iter()
        .filter_map(|l| {
            let sp = l.speed_mbps?;
            let (want, by_gen) = match l.full_speed_mbps() {
                Some(f) => (f, true),
                None => (fastest?, false),
            };
            (sp < want).then_some((*l, sp, want, by_gen))
        })
        .collect();
    let all_alike = slow.len() > 1
        && slow.len() == up.len()
        && slow.iter().all(|(l, sp, want, by_gen)| {
            *by_gen && (*sp, *want, l.version) == (slow[0].1, slow[0].2, slow[0].0.version)
        });
    if all_alike {
        let (l, sp, want, _) = slow[0];
        out.push((
            false,
            format!(
                "GPU {}: all {} NVLinks run at {sp} MB/s, below the {want} MB/s of NVLink {}",
                s.gpu,
                slow.len(),
                l.version.unwrap_or_default()
            ),
        ));
        return out;
    }
    for (l, sp, want, by_gen) in slow {
        let of = if by_gen {
            format!("NVLink {}", l.version.unwrap_or_default())
        } else {
            "its other links".to_string()
        };
        out.push((
            false,
            format!(
                "GPU {}: NVLink {} (to {}) runs at {sp} MB/s, below the {want} MB/s of {of}",
                s.gpu,
                l.link,
                l.far_end()
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(n: u32, up: bool, peer: Option<u32>, speed: u32, crc: u64) -> NvlinkLink {
        NvlinkLink {
            link: n,
            up,
            speed_mbps: Some(speed),
            version: Some(4),
            remote_bus_id: None,
            remote_type: peer.map(|_| RemoteType::Gpu),
            peer_gpu: peer,
            crc_flit_errors: Some(crc),
            crc_data_errors: None,
            replay_errors: Some(0),
            recovery_errors: Some(0),
        }
    }

    #[test]
    fn rows_sum_the_links_and_are_absent_without_links() {
        let links = vec![
            link(0, true, Some(1), 26_562, 5),
            link(5, false, Some(5), 26_562, 7),
            link(6, false, Some(4), 26_562, 0),
        ];
        assert_eq!(NvlinkRead::CrcFlitErrors.of(&links), Some(12.0));
        assert_eq!(NvlinkRead::CrcDataErrors.of(&links), None);
        assert_eq!(NvlinkRead::LinksDown.of(&links), Some(2.0));
        assert_eq!(NvlinkRead::DownPeers.of(&links), Some(48.0));
        assert_eq!(NvlinkRead::LinksDown.of(&[]), None);
        assert_eq!(NvlinkRead::CrcFlitErrors.of(&[]), None);
    }

    #[test]
    fn counters_near_the_top_of_u64_saturate_instead_of_overflowing() {
        // a hostile or broken driver: u64::MAX on two links (the sum panicked in debug builds)
        let links = vec![
            link(0, true, Some(1), 26_562, u64::MAX),
            link(1, true, Some(2), 26_562, u64::MAX),
        ];
        assert_eq!(NvlinkRead::CrcFlitErrors.of(&links), Some(u64::MAX as f64));
    }

    /// One link's counter missing from a reading (a transient error) leaves the total absent,
    /// not smaller: a smaller total followed by a whole one would read as a burst of errors.
    #[test]
    fn a_total_missing_a_link_is_absent_not_smaller() {
        let mut links = vec![
            link(0, true, Some(1), 26_562, 40),
            link(1, true, Some(2), 26_562, 2),
        ];
        assert_eq!(NvlinkRead::CrcFlitErrors.of(&links), Some(42.0));
        links[1].crc_flit_errors = None;
        assert_eq!(NvlinkRead::CrcFlitErrors.of(&links), None);
    }

    #[test]
    fn a_link_down_is_critical_and_a_slow_link_a_warning() {
        let s = NvlinkStatus {
            gpu: 3,
            time_ms: 0,
            links: vec![
                link(0, true, Some(1), 26_562, 0),
                link(1, true, Some(2), 13_281, 0),
                link(5, false, Some(5), 26_562, 0),
            ],
        };
        let f = findings(&s);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(
            f[0].0 && f[0].1.contains("NVLink 5 (to GPU 5) is down"),
            "{f:?}"
        );
        assert!(
            !f[1].0
                && f[1]
                    .1
                    .contains("13281 MB/s, below the 26562 MB/s of NVLink 4"),
            "{f:?}"
        );
    }

    /// The far end in words: a GPU of this machine, an NVSwitch, a GPU NVML does not list
    /// here, and — when the driver cannot say (no `nvmlDeviceGetNvLinkRemoteDeviceType`) — an
    /// unknown device, never a guessed switch.
    #[test]
    fn the_far_end_is_named_by_its_type() {
        let mut l = link(3, false, None, 26_562, 0);
        l.remote_bus_id = Some("00000000:05:00.0".into());
        l.remote_type = Some(RemoteType::Switch);
        assert_eq!(l.far_end(), "NVSwitch 00000000:05:00.0");
        l.remote_type = Some(RemoteType::Gpu);
        assert_eq!(
            l.far_end(),
            "GPU 00000000:05:00.0 (not visible to gpuwatch)"
        );
        l.remote_type = None;
        assert_eq!(l.far_end(), "unknown device 00000000:05:00.0");
        l.remote_type = Some(RemoteType::Unknown);
        assert_eq!(l.far_end(), "unknown device 00000000:05:00.0");
        l.remote_bus_id = None;
        assert_eq!(l.far_end(), "unknown device");
        l.peer_gpu = Some(5);
        assert_eq!(l.far_end(), "GPU 5");
        assert_eq!(RemoteType::from_nvml(2), RemoteType::Switch);
        assert_eq!(RemoteType::from_nvml(0xFF), RemoteType::Unknown);
        assert_eq!(
            serde_json::to_value(RemoteType::IbmNpu).unwrap(),
            serde_json::json!("ibm_npu")
        );
    }

    #[test]
    fn the_driver_version_enum_decodes_to_a_generation() {
        assert_eq!(generation(6), Some(4), "H100: NVML_NVLINK_VERSION_4_0");
        assert_eq!(generation(5), Some(3), "A100 answers 3_1");
        assert_eq!(generation(7), Some(5));
        assert_eq!(generation(0), None);
        assert_eq!(full_speed_mbps(4), Some(26_562));
        assert_eq!(full_speed_mbps(3), None, "A100 and GA102 share the version");
    }

    /// Every link of an H100 runs NVLink 4's 26,562 MB/s: all of them trained lower is a
    /// finding (one, not 18); without a known speed for the generation the fastest link is the
    /// yardstick, and a board whose links all agree has none.
    #[test]
    fn slow_links_are_judged_against_their_generation() {
        let slow = |n: u32| link(n, true, None, 13_281, 0);
        let s = NvlinkStatus {
            gpu: 0,
            time_ms: 0,
            links: (0..18).map(slow).collect(),
        };
        let f = findings(&s);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].1
                .contains("all 18 NVLinks run at 13281 MB/s, below the 26562 MB/s of NVLink 4"),
            "{f:?}"
        );
        let mut a100: Vec<NvlinkLink> = (0..12).map(|n| link(n, true, None, 25_000, 0)).collect();
        for l in &mut a100 {
            l.version = Some(3);
        }
        let mut s = NvlinkStatus {
            gpu: 1,
            time_ms: 0,
            links: a100,
        };
        assert!(findings(&s).is_empty());
        s.links[4].speed_mbps = Some(12_500);
        let f = findings(&s);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].1.contains("NVLink 4 (to unknown device) runs at 12500 MB/s, below the 25000 MB/s of its other links"),
            "{f:?}"
        );
        let healthy = NvlinkStatus {
            gpu: 2,
            time_ms: 0,
            links: (0..18).map(|n| link(n, true, None, 26_562, 0)).collect(),
        };
        assert!(findings(&healthy).is_empty());
    }

    /// A counter the driver does not give on a link is left out of the total; a counter that
    /// no link gives is absent.
    #[test]
    fn a_counter_unsupported_on_a_link_is_left_out_of_the_total() {
        let mut links = vec![
            link(0, true, Some(1), 26_562, 40),
            link(1, true, Some(2), 26_562, 2),
        ];
        links[1].crc_flit_errors = None;
        let unsupported = |l: &NvlinkLink, c: usize| !(l.link == 1 && c == 0);
        assert_eq!(
            NvlinkRead::CrcFlitErrors.of_counted(&links, unsupported),
            Some(40.0)
        );
        assert_eq!(NvlinkRead::CrcFlitErrors.of(&links), None);
        assert_eq!(
            NvlinkRead::CrcFlitErrors.of_counted(&links, |_, c| c != 0),
            None
        );
        assert_eq!(
            NvlinkRead::ReplayErrors.of_counted(&links, unsupported),
            Some(0.0)
        );
    }

    #[test]
    fn the_view_gives_each_links_counter_rise_since_the_reading_before() {
        let status = |t: i64, crc: [u64; 2]| NvlinkStatus {
            gpu: 0,
            time_ms: t,
            links: vec![
                link(0, true, Some(1), 26_562, crc[0]),
                link(1, true, Some(2), 26_562, crc[1]),
            ],
        };
        let first = NvlinkView::next(None, &status(1_000, [5, 7]));
        assert_eq!(first.interval_s, None);
        assert_eq!(first.deltas[0], [None; 4]);
        let second = NvlinkView::next(Some(&first), &status(6_000, [5, 27]));
        assert_eq!(second.interval_s, Some(5.0));
        assert_eq!(second.deltas[0][0], Some(0));
        assert_eq!(second.deltas[1][0], Some(20));
        assert_eq!(second.deltas[1][1], None, "CRC data not read");
        assert_eq!(second.deltas[1][2], Some(0));
        // the driver reloaded: counters back near 0 are no rise
        let third = NvlinkView::next(Some(&second), &status(11_000, [0, 1]));
        assert_eq!(third.deltas[1][0], None);
    }
}
