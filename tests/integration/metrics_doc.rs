//! `docs/metrics.md` is generated from the metric table (`model::METRICS`); this test fails
//! when the file is stale. Regenerate with `GPUWATCH_BLESS=1 cargo test --test integration metrics_doc`.

use std::fmt::Write as _;

use gpuwatch::model::{MetricKind, METRICS};

fn render() -> String {
    let mut s = String::new();
    s.push_str(
        "# Metrics\n\n\
         <!-- Generated from `src/model.rs` (METRICS) by tests/integration/metrics_doc.rs; do not edit. -->\n\n\
         Every metric gpuwatch samples per GPU and tick, in the order of the columns of `gpuwatch record`\n\
         (after `timestamp,index,uuid,name,pci_bus_id,minor,state`; followed by `xids,processes`). The key\n\
         is also the name rules use and the JSON key under `gpus[].metrics` in `gpuwatch status --json`, the\n\
         only place and name under which `status --json` shows a metric value.\n\n\
         Values are stored in canonical units: NVML's milliwatts become watts, millijoules joules, KB/s\n\
         (read as KiB/s, as nvitop does) bytes per second, and memory is in bytes. A value the GPU cannot give\n\
         (NVML `NOT_SUPPORTED`, a missing symbol, no permission) is absent: an empty CSV cell, `null` in JSON,\n\
         never 0. A lost GPU (`GPU_IS_LOST`) has state `lost` and no values. Counters are cumulative; rules\n\
         look at their deltas.\n\n\
         The source column says where each value comes from, and the sampler reads every row through it:\n\
         a dedicated NVML call; a field of the one `nvmlDeviceGetFieldValues` call per GPU and tick (with the\n\
         factor to the canonical unit, and the dedicated call used instead on GPUs without the field);\n\
         `derived` (computed from other metrics); or `host` (not from NVML).\n\n\
         | key | unit | kind | source | nvidia-smi | dcgm-exporter | meaning |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for d in METRICS {
        let kind = match d.kind {
            MetricKind::Gauge => "gauge",
            MetricKind::Counter => "counter",
        };
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} | {} | {} | {} |",
            d.key,
            d.unit,
            kind,
            d.source,
            d.smi.map_or_else(|| "—".to_string(), |x| format!("`{x}`")),
            d.dcgm.map_or_else(|| "—".to_string(), |x| format!("`{x}`")),
            d.help
        );
    }
    s.push_str(
        "\nThe `clock_event_reasons` bitmask uses NVML's bits: gpu_idle 0x1, applications_clocks 0x2,\n\
         sw_power_cap 0x4, hw_slowdown 0x8, sync_boost 0x10, sw_thermal 0x20, hw_thermal 0x40,\n\
         hw_power_brake 0x80, display_clocks 0x100.\n",
    );
    s
}

#[test]
fn metrics_doc_matches_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");
    let want = render();
    if std::env::var_os("GPUWATCH_BLESS").is_some() {
        std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/docs")).unwrap();
        std::fs::write(path, &want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/metrics.md is stale; regenerate with GPUWATCH_BLESS=1 cargo test --test integration metrics_doc"
    );
}
