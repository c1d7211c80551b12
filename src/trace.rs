//! gpuwatch's CSV recording format (COMMON.md, interface 1), written: header
//! `timestamp,index,uuid,name,pci_bus_id,minor,state,<METRICS keys…>,xids,processes`, one row
//! per GPU per tick, rows of a tick sharing the RFC 3339 timestamp, empty cell = absent; and the
//! small text helpers its readers share. Reading any log, this format included, is the
//! importer's job (module `import`).

use crate::model::{Snapshot, METRICS};

/// Splits one CSV line (RFC 4180 quoting) into fields.
pub fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    cur.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' {
            quoted = true;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

/// Formats UTC ms as RFC 3339 with milliseconds (`2026-12-02T15:00:00.123Z`).
pub fn format_time_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
    )
}

/// `v` for an error message: quoted with control characters escaped, at most 80 characters.
pub fn quoted(v: &str) -> String {
    let n = v.chars().count();
    if n <= 80 {
        format!("{v:?}")
    } else {
        format!(
            "{:?} ({n} characters)",
            crate::values::truncate_chars(v, 81)
        )
    }
}

/// Writes snapshots as a gpuwatch CSV recording (used by tests, fixtures and the benchmark; the
/// recorder owns the live writer).
pub fn write_gpuwatch_csv(
    out: &mut impl std::io::Write,
    snaps: &[Snapshot],
) -> std::io::Result<()> {
    write_gpuwatch_header(out)?;
    for s in snaps {
        write_gpuwatch_rows(out, s)?;
    }
    Ok(())
}

/// The gpuwatch CSV header line.
pub fn write_gpuwatch_header(out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut header = String::from("timestamp,index,uuid,name,pci_bus_id,minor,state");
    for d in METRICS {
        header.push(',');
        header.push_str(d.key);
    }
    header.push_str(",xids,processes");
    writeln!(out, "{header}")
}

/// The rows of one snapshot in gpuwatch CSV.
pub fn write_gpuwatch_rows(out: &mut impl std::io::Write, s: &Snapshot) -> std::io::Result<()> {
    use std::fmt::Write as _;
    let ts = format_time_ms(s.time_ms);
    for g in &s.gpus {
        let mut line = String::with_capacity(256);
        let quote = |f: &str| {
            if f.contains([',', '"']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.to_string()
            }
        };
        let _ = write!(
            line,
            "{ts},{},{},{},{},{},{}",
            g.id.index,
            quote(&g.id.uuid),
            quote(&g.id.name),
            quote(&g.id.pci_bus_id),
            g.id.minor.map(|m| m.to_string()).unwrap_or_default(),
            g.state.label()
        );
        for v in &g.values.0 {
            line.push(',');
            if let Some(v) = v {
                let _ = write!(line, "{v}");
            }
        }
        line.push(',');
        let xids: Vec<String> = s
            .xids
            .iter()
            .filter(|x| x.gpu_index == g.id.index)
            .map(|x| x.xid.to_string())
            .collect();
        line.push_str(&xids.join(";"));
        line.push(',');
        if let Some(procs) = &s.processes {
            let items: Vec<String> = procs
                .iter()
                .filter(|p| p.gpu_index == g.id.index)
                .map(|p| {
                    format!(
                        "{}:{}",
                        p.pid,
                        p.used_mem_bytes.map(|b| b.to_string()).unwrap_or_default()
                    )
                })
                .collect();
            line.push_str(&items.join(";"));
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceId, DeviceState, GpuSample, Metric, MetricValues, XidEvent};

    #[test]
    fn csv_quotes() {
        assert_eq!(
            split_csv(r#"a,"b,c","d""e",,f"#),
            vec!["a", "b,c", "d\"e", "", "f"]
        );
        assert_eq!(format_time_ms(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn round_trip_gpuwatch_csv() {
        let dir = tempfile::tempdir().unwrap();
        let mut snaps = Vec::new();
        for t in 0..3 {
            let mut values = MetricValues::default();
            values.set(Metric::Util, Some(50.5));
            values.set(Metric::MemUsed, Some(1e9));
            let gpus = (0..2)
                .map(|i| GpuSample {
                    time_ms: t * 1000,
                    id: DeviceId {
                        index: i,
                        uuid: format!("GPU-{i}"),
                        name: "NVIDIA \"X\", 80GB".into(),
                        ..DeviceId::default()
                    },
                    state: DeviceState::Ok,
                    values: values.clone(),
                })
                .collect();
            snaps.push(Snapshot {
                time_ms: 1_700_000_000_000 + t * 1000,
                gpus,
                processes: Some(vec![]),
                xids: if t == 1 {
                    vec![XidEvent::new(0, 1, "GPU-1", 79)]
                } else {
                    vec![]
                },
                ..Snapshot::default()
            });
        }
        let path = dir.path().join("t.csv");
        let mut f = std::fs::File::create(&path).unwrap();
        write_gpuwatch_csv(&mut f, &snaps).unwrap();
        drop(f);
        let r = crate::import::Importer::open(&path, &Default::default()).unwrap();
        assert_eq!(r.format(), crate::import::Format::Gpuwatch);
        let back: Vec<Snapshot> = r
            .map(|t| t.map(|t| t.snapshot))
            .collect::<anyhow::Result<_>>()
            .unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[1].xids.len(), 1);
        assert_eq!(back[1].xids[0].gpu_index, 1);
        assert_eq!(back[0].gpus[1].id.name, "NVIDIA \"X\", 80GB");
        assert_eq!(back[2].gpus[0].get(Metric::Util), Some(50.5));
        assert_eq!(back[2].gpus[0].get(Metric::Temp), None);
    }
}
