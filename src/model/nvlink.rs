//! NVLink as plain data: what the per-link reads give ([`NvlinkLink`]), the GPU-level metric
//! rows they feed ([`NvlinkRead`], summed over the links) and the judgements `status` and
//! `doctor` make of them (a link down, a link below its speed).
//!
//! The sampler reads the links on its slow path (process cadence): per link its state, the four
//! error counters and, where the driver gives them, its speed and far end. A GPU without NVLink
//! (PCIe boards, consumer GPUs) has no links, and every NVLink row is absent, never 0.

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

    /// This row's value from a GPU's links (`None` without links, or when no link gave it).
    /// [`NvlinkRead::Bandwidth`] is a rate the reader computes; it is not derived here.
    pub fn of(self, links: &[NvlinkLink]) -> Option<f64> {
        if links.is_empty() {
            return None;
        }
        // saturating: a driver's counters near u64::MAX on two links must not overflow (a
        // panic in a debug build, a wrapped small total otherwise)
        // A total needs every link: one link's counter missing this time (a transient error)
        // would make the total drop, and the next whole reading look like a burst of new errors.
        let sum = |f: fn(&NvlinkLink) -> Option<u64>| {
            let all: Option<Vec<u64>> = links.iter().map(f).collect();
            all.map(|v| v.iter().fold(0u64, |a, b| a.saturating_add(*b)) as f64)
        };
        match self {
            NvlinkRead::CrcFlitErrors => sum(|l| l.crc_flit_errors),
            NvlinkRead::CrcDataErrors => sum(|l| l.crc_data_errors),
            NvlinkRead::ReplayErrors => sum(|l| l.replay_errors),
            NvlinkRead::RecoveryErrors => sum(|l| l.recovery_errors),
            NvlinkRead::Bandwidth => None,
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

/// One NVLink of a GPU as last read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvlinkLink {
    /// Link number (0 … 17).
    pub link: u32,
    /// Whether the link is active.
    pub up: bool,
    /// The speed it runs at, MB/s (links 0–11: per-link field; else the GPU's common speed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mbps: Option<u32>,
    /// NVLink version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// PCI bus id of the far end (a GPU or an NVSwitch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_bus_id: Option<String>,
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
    /// What is at the far end, in words: `GPU 5`, `00000000:05:00.0` (a switch) or `?`.
    pub fn far_end(&self) -> String {
        match (self.peer_gpu, &self.remote_bus_id) {
            (Some(p), _) => format!("GPU {p}"),
            (None, Some(bus)) => bus.clone(),
            (None, None) => "?".into(),
        }
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

/// A finding about a GPU's links: `(severity is critical, text)`. A link down is critical; a
/// link up below the fastest speed among the GPU's links is degraded (a warning).
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
    let full = s
        .links
        .iter()
        .filter(|l| l.up)
        .filter_map(|l| l.speed_mbps)
        .max();
    if let Some(full) = full {
        for l in s.links.iter().filter(|l| l.up) {
            if let Some(sp) = l.speed_mbps.filter(|sp| *sp < full) {
                out.push((
                    false,
                    format!(
                        "GPU {}: NVLink {} (to {}) runs at {sp} MB/s, below the {full} MB/s of its other links",
                        s.gpu,
                        l.link,
                        l.far_end()
                    ),
                ));
            }
        }
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
        assert!(!f[1].0 && f[1].1.contains("13281 MB/s"), "{f:?}");
    }
}
