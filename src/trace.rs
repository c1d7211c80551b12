//! gpuwatch's CSV recording format (COMMON.md, interface 1), written: header
//! `timestamp,index,uuid,name,pci_bus_id,minor,state,<METRICS keys…>,xids,processes`, one row
//! per GPU per tick, rows of a tick sharing the RFC 3339 timestamp, empty cell = absent; and the
//! small text helpers its readers share. Reading any log, this format included, is the
//! importer's job (module `import`).

use crate::model::Snapshot;

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

/// Writes snapshots as a gpuwatch CSV recording, as `gpuwatch record` writes them (the
/// recorder's own rows: each GPU's process list on every row, as last refreshed; used by tests,
/// fixtures and the benchmark).
pub fn write_gpuwatch_csv(
    out: &mut impl std::io::Write,
    snaps: &[Snapshot],
) -> std::io::Result<()> {
    writeln!(out, "{}", crate::record::header_line())?;
    let mut rows = crate::record::CsvRows::new();
    let mut text = String::new();
    for s in snaps {
        text.clear();
        rows.render(s, &mut text);
        out.write_all(text.as_bytes())?;
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

#[cfg(test)]
mod process_tests {
    use super::*;
    use crate::model::{DeviceId, DeviceState, GpuSample, ProcSample};

    /// What a recording says each GPU runs at each tick comes back from it: a list where it
    /// changed, "unchanged" (`None`) where every row repeats the tick before — read forward,
    /// the same lists.
    #[test]
    fn a_recording_gives_back_each_ticks_processes() {
        let dir = tempfile::tempdir().unwrap();
        // (pid, GPU) per tick; `None`: the sampler read no list at that tick
        let plan: Vec<Option<Vec<(u32, u32)>>> = vec![
            Some(vec![(10, 0), (20, 1)]),
            None,
            None,
            Some(vec![(10, 0), (20, 1)]),
            Some(vec![(10, 0), (21, 1), (22, 1)]),
            None,
            Some(vec![]),
            None,
            Some(vec![(30, 0)]),
        ];
        let snaps: Vec<Snapshot> = plan
            .iter()
            .enumerate()
            .map(|(t, procs)| Snapshot {
                time_ms: 1_700_000_000_000 + t as i64 * 1000,
                gpus: (0..2)
                    .map(|i| GpuSample {
                        time_ms: 1_700_000_000_000 + t as i64 * 1000,
                        id: DeviceId {
                            index: i,
                            uuid: format!("GPU-{i}"),
                            ..DeviceId::default()
                        },
                        state: DeviceState::Ok,
                        values: Default::default(),
                    })
                    .collect(),
                processes: procs.as_ref().map(|l| {
                    l.iter()
                        .map(|(pid, gpu)| {
                            ProcSample::compute(*pid, *gpu, format!("GPU-{gpu}"), Some(1 << 30))
                        })
                        .collect()
                }),
                ..Snapshot::default()
            })
            .collect();
        let path = dir.path().join("p.csv");
        let mut f = std::fs::File::create(&path).unwrap();
        write_gpuwatch_csv(&mut f, &snaps).unwrap();
        drop(f);
        let mut current: Vec<(u32, u32)> = Vec::new();
        let mut read = Vec::new();
        let mut unchanged = 0;
        for t in crate::import::Importer::open(&path, &Default::default()).unwrap() {
            let snap = t.unwrap().snapshot;
            match snap.processes {
                Some(l) => {
                    assert!(l
                        .iter()
                        .all(|p| p.gpu_uuid == format!("GPU-{}", p.gpu_index)));
                    current = l.iter().map(|p| (p.pid, p.gpu_index)).collect();
                }
                None => unchanged += 1,
            }
            read.push(current.clone());
        }
        // what the recorder wrote at each tick: the last list read
        let mut last = Vec::new();
        let want: Vec<Vec<(u32, u32)>> = plan
            .iter()
            .map(|p| {
                if let Some(l) = p {
                    last.clone_from(l);
                }
                last.clone()
            })
            .collect();
        assert_eq!(read, want);
        assert_eq!(
            unchanged, 5,
            "ticks 1, 2, 3, 5 and 7 repeat the tick before"
        );
    }
}
