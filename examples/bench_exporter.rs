//! Cost of rendering `/metrics` for 8 GPUs with every metric, 16 alerts and 8 processes — what
//! a scrape of a new sample costs beyond the HTTP exchange (`bench/exporter.sh` measures that).
//!
//!     cargo run --release --example bench_exporter

use std::time::Instant;

use gpuwatch::exporter::{render, AlertRow, ExportState};
use gpuwatch::model::{DeviceId, DeviceState, GpuSample, ProcSample, Snapshot, METRICS};

fn main() {
    let gpus = (0..8u32)
        .map(|i| {
            let mut values = gpuwatch::model::MetricValues::default();
            for (k, d) in METRICS.iter().enumerate() {
                values.set(d.id, Some(f64::from(i) * 10.0 + k as f64 + 0.5));
            }
            GpuSample {
                time_ms: 1_700_000_000_000,
                id: DeviceId {
                    index: i,
                    minor: Some(i),
                    uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
                    pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
                    name: "NVIDIA H100 80GB HBM3".into(),
                },
                state: DeviceState::Ok,
                values,
            }
        })
        .collect();
    let processes = (0..8u32)
        .map(|i| ProcSample::compute(1000 + i, i, String::new(), Some(60 << 30)))
        .collect();
    let state = ExportState {
        hostname: "node-17".into(),
        snapshot: Some(Snapshot {
            time_ms: 1_700_000_000_000,
            gpus,
            processes: Some(processes),
            ..Snapshot::default()
        }),
        alerts: (0..16)
            .map(|i| AlertRow {
                alertname: format!("rule_{i}"),
                severity: "warning".into(),
                gpu: Some(i % 8),
                state: "firing",
            })
            .collect(),
        ..ExportState::default()
    };
    let n = 5000;
    let t = Instant::now();
    let mut bytes = 0;
    for _ in 0..n {
        bytes = render(&state, false).len();
    }
    let per = t.elapsed() / n;
    println!("render /metrics for 8 GPUs ({bytes} bytes): {per:?} per page");
}
