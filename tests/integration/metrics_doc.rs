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
         factor to the canonical unit, and the dedicated call used instead on GPUs without the field); a GPM\n\
         metric (`nvmlGpmMetricsGet`, Hopper and later: one GPM sample per GPU every `[daemon] gpm_interval`\n\
         (10 s; `record --gpm-interval`, 1 s; `0s`: every tick), the metric computed between it and the sample\n\
         before, so it is the average over that span, shown at the ticks until the next; absent until the second,\n\
         on GPUs without GPM and with `[daemon] gpm = false` / `--no-gpm`, and `status --json` says why under\n\
         `gpus[].gpm`); `derived` (computed from other metrics); or `host` (not from NVML). On a GPU with\n\
         MIG on, each GPU instance also has its own values of the GPM activity rows (`sm_active`,\n\
         `tensor_active`, `dram_active`, …: `nvmlGpmMigSampleGet` at each process-list read), carried\n\
         with its MIG devices; see [mig.md](mig.md).\n\n\
         The dcgm-exporter column is the name `/metrics` exports a row under, in dcgm-exporter's unit:\n\
         framebuffer memory in MiB, energy in mJ, the profiling activities (`DCGM_FI_PROF_*` percentages) as\n\
         ratios 0–1, everything else in the unit shown here.\n\n\
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
    render_columns(&mut s);
    s
}

/// The column names `import` reads in CSV logs (`gpuwatch::import::columns::COLUMNS`).
fn render_columns(s: &mut String) {
    use gpuwatch::import::columns::{Means, Target, COLUMNS};
    s.push_str(
        "\n## Column names in imported CSV logs\n\n\
         `gpuwatch import` (and `replay`, `report`, `export`) reads a CSV log's header by name: every\n\
         nvidia-smi query name of the table above (`utilization.gpu`, `memory.used [MiB]`), every key\n\
         (`util`, `mem_used`), and the names below, compared in lower case with `.`, ` `, `-` and `/` read\n\
         as `_`. The unit comes from a bracket (`[%]`, `(MiB)`, `(MB)`, `[W]`) or a suffix (`_percent`,\n\
         `_pct`, `_W`, `_mW`, `_C`, `_MiB`, `_MB`, `_GB`, `_KB`, `_bytes`, `_MHz`), and a unit in a cell\n\
         (`81.25 W`, `2 GB`, `75000 mW`) wins over the header's. Memory without a unit is MiB\n\
         (nvidia-smi's `MB` are MiB). A column whose name is not known is ignored, named in one warning;\n\
         an ambiguous one is an error that names it: `--columns NAME=metric` (e.g. `--columns mem=mem_used`)\n\
         settles it, and `--columns timestamp,index,util,mem_used` names every column of a log without a\n\
         header, in order (`-` skips one).\n\n\
         | names | column |\n\
         |---|---|\n",
    );
    for (names, means) in COLUMNS {
        let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
        let what = match means {
            Means::Is(t) => format!("`{}`", t.name()),
            Means::ByUnit {
                percent,
                memory,
                bare,
            } => {
                let say = |t: &Option<Target>| {
                    t.map_or("ambiguous".to_string(), |t| format!("`{}`", t.name()))
                };
                format!(
                    "with `%`: {}; with a memory unit: {}; without a unit: {}",
                    say(percent),
                    say(memory),
                    say(bare)
                )
            }
        };
        let _ = writeln!(s, "| {} | {what} |", names.join(", "));
    }
    let zones: Vec<String> = gpuwatch::import::stamp::ZONES
        .iter()
        .filter(|(name, _, _)| *name != "Z")
        .map(|(name, minutes, ambiguous)| {
            let sign = if *minutes < 0 { '-' } else { '+' };
            let m = minutes.abs();
            format!(
                "`{name}` {sign}{:02}:{:02}{}",
                m / 60,
                m % 60,
                if *ambiguous { " (ambiguous)" } else { "" }
            )
        })
        .collect();
    let _ = write!(
        s,
        "\nTimes are read as `import` documents them (nvidia-smi's, ISO 8601, `date`'s forms with\n\
         `AM`/`PM`, epoch seconds or milliseconds, seconds since `--t0`). A zone in the time is honoured:\n\
         `Z`, a numeric offset (`+0800`, `+08:00`) or a name: {}.\n\
         Times without a zone are read in `--tz` (an offset or one of those names), UTC when it is not\n\
         given, with one warning. An ambiguous name (`CST`: US Central as `date` writes it in Chicago, or\n\
         China; `IST`: India, Ireland or Israel) is read as above unless `--tz` is given: then as its\n\
         offset (`--tz +08:00` reads `CST` as China Standard Time).\n",
        zones.join(", ")
    );
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
