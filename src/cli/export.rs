//! `gpuwatch export --openmetrics`: any log `import` reads, as OpenMetrics under dcgm-exporter's
//! names with timestamps, for `promtool tsdb create-blocks-from openmetrics` — last month's logs
//! in Grafana beside live data.
//!
//! OpenMetrics wants each family's samples together (and each series in time order), while a
//! log is a sequence of ticks; samples are spooled per family and series (a GPU, or one of its
//! GPU instances) — in memory up to [`SPOOL_BUFFERED`] bytes in all, then appended to one
//! temporary file per family and series, opened, written and closed at once (a log with MIG,
//! 8 GPUs × 7 GPU instances × 14 families, has more series than a process may hold files open)
//! — so memory stays bounded whatever the log's length, and joined at the end.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;

use super::import::LogArgs;
use super::GlobalArgs;
use crate::exporter::BackfillSeries;

/// Arguments of `export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Write OpenMetrics (the only format so far; required so a later one can be chosen).
    #[arg(long, required = true)]
    pub openmetrics: bool,
    /// The logs (read one after another).
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Where to write (standard output when not given).
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The `Hostname` / `hostname` label (default: this machine's name).
    #[arg(long, value_name = "NAME")]
    pub hostname: Option<String>,
    /// How to read the logs.
    #[command(flatten)]
    pub log: LogArgs,
}

/// Runs `export`.
pub fn run(_global: &GlobalArgs, args: &ExportArgs) -> anyhow::Result<i32> {
    let host = args.hostname.clone().unwrap_or_else(crate::sys::hostname);
    // Where the output goes is settled before the logs are read (a directory is an error now,
    // not after minutes of parsing).
    let out_path = args.out.clone().unwrap_or_else(|| PathBuf::from("-"));
    let target = crate::sys::output::target(&out_path, crate::sys::output::Dash::Stdout)?;
    let spool = Spool::new()?;
    let mut parts = Parts::new(&spool, SPOOL_BUFFERED);
    let mut failed: Option<std::io::Error> = None;
    let mut ticks = 0u64;
    let mut last_ms = i64::MIN;
    for f in &args.files {
        let importer = crate::import::Importer::open(f, &args.log.options())?;
        let stats = importer.stats();
        let mut behind = 0u64;
        let (assembled, mut back) = crate::import::read_ahead(importer);
        for tick in assembled {
            let tick = tick?;
            // One time line: a backfill cannot take a series going back in time.
            if tick.snapshot.time_ms <= last_ms {
                behind += 1;
                continue;
            }
            last_ms = tick.snapshot.time_ms;
            ticks += 1;
            crate::exporter::backfill(&tick.snapshot, &host, |family, series, line| {
                if failed.is_none() {
                    failed = parts.write((family, series), line).err();
                }
            });
            if let Some(e) = failed.take() {
                return Err(e).context("spooling samples");
            }
            back.give(tick.snapshot);
        }
        for w in stats.warnings(&f.display().to_string()) {
            eprintln!("warning: {w}");
        }
        if behind > 0 {
            eprintln!(
                "warning: {}: {behind} tick(s) not later than what was exported before them were left out (a backfill is one time line: give rotated logs oldest first, e.g. gpu.csv.2 gpu.csv.1 gpu.csv)",
                f.display()
            );
        }
    }
    let mut out = crate::sys::output::Output::to(&target)?;
    let headers = crate::exporter::backfill_headers();
    parts.join(&headers, &mut out)?;
    out.write_all(b"# EOF\n")?;
    out.finish()?;
    eprintln!("exported {ticks} ticks as OpenMetrics");
    Ok(0)
}

/// Bytes of samples held in memory before they go to the spool files.
const SPOOL_BUFFERED: usize = 16 << 20;

/// A family (its position in the backfill's families) and one of its series.
type PartKey = (usize, BackfillSeries);

/// The samples of each family and series: held in memory up to `budget` bytes in all, then
/// each series' appended to its spool file — opened, written and closed at once, so no file
/// stays open however many series a log has — and the memory freed.
struct Parts<'a> {
    spool: &'a Spool,
    budget: usize,
    /// Bytes held in `held`.
    held_bytes: usize,
    /// Per series: its samples not yet in its file, and whether it has a file.
    held: BTreeMap<PartKey, (Vec<u8>, bool)>,
}

impl Parts<'_> {
    fn new(spool: &Spool, budget: usize) -> Parts<'_> {
        Parts {
            spool,
            budget,
            held_bytes: 0,
            held: BTreeMap::new(),
        }
    }

    /// Adds `line` to series `key`.
    fn write(&mut self, key: PartKey, line: &str) -> std::io::Result<()> {
        let (buf, _) = self.held.entry(key).or_default();
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        self.held_bytes += line.len() + 1;
        if self.held_bytes > self.budget {
            self.spill()?;
        }
        Ok(())
    }

    /// Every series' samples held in memory appended to its file.
    fn spill(&mut self) -> std::io::Result<()> {
        for (&key, (buf, on_disk)) in &mut self.held {
            if buf.is_empty() {
                continue;
            }
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.spool.part(key))?;
            file.write_all(buf)?;
            *on_disk = true;
            *buf = Vec::new();
        }
        self.held_bytes = 0;
        Ok(())
    }

    /// Writes every family, its header (`headers`, by family position) first, then its series
    /// one after another, each in the order its samples came.
    fn join(self, headers: &[String], out: &mut impl std::io::Write) -> anyhow::Result<()> {
        let mut current = None;
        for ((family, series), (buf, on_disk)) in self.held {
            if current != Some(family) {
                let header = headers.get(family).context("a family without a header")?;
                out.write_all(header.as_bytes())?;
                current = Some(family);
            }
            if on_disk {
                let mut part = std::fs::File::open(self.spool.part((family, series)))
                    .context("reading back the spooled samples")?;
                std::io::copy(&mut part, out)?;
            }
            out.write_all(&buf)?;
        }
        Ok(())
    }
}

/// A private spool directory under the system's temporary directory, removed when dropped.
struct Spool(PathBuf);

impl Spool {
    fn new() -> anyhow::Result<Spool> {
        let dir = std::env::temp_dir().join(format!(
            "gpuwatch-export-{}-{}",
            std::process::id(),
            crate::sys::now_ms()
        ));
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot make the spool directory {}", dir.display()))?;
        Ok(Spool(dir))
    }

    /// The file that spools `family`'s samples of `series`.
    fn part(&self, (family, series): PartKey) -> PathBuf {
        self.0.join(match series {
            (gpu, None) => format!("{family}-{gpu}"),
            (gpu, Some(gi)) => format!("{family}-{gpu}-{gi}"),
        })
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More series than a process may hold files open (the usual limit is 1024), spilled to
    /// their files many times over: every family comes once with its header, each series'
    /// samples together and in the order written, and no file is left open in between.
    #[test]
    fn many_series_spool_through_few_open_files() {
        let spool = Spool::new().expect("a spool directory");
        let mut parts = Parts::new(&spool, 4096);
        let families: usize = 3;
        let series: u32 = 700;
        let ticks = 5;
        for t in 0..ticks {
            for f in 0..families {
                for k in 0..series {
                    let key: PartKey = (f, (k / 7, (k % 7 != 0).then_some(k % 7)));
                    parts
                        .write(key, &format!("f{f}{{s=\"{k}\"}} {t} {t}.000"))
                        .expect("spooled");
                }
            }
        }
        // far more than the budget was written: most series went to their files, some more
        // than once
        let files = std::fs::read_dir(&spool.0).expect("the spool").count();
        assert!(files >= families * 350, "{files} spool files");
        // nothing of the spool is held open: this process's descriptors did not grow with it
        let open = std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .count();
        assert!(open < 256, "{open} descriptors open");
        let headers: Vec<String> = (0..families)
            .map(|f| format!("# TYPE f{f} gauge\n"))
            .collect();
        let mut out = Vec::new();
        parts.join(&headers, &mut out).expect("joined");
        let out = String::from_utf8(out).expect("text");
        let mut want = String::new();
        for (f, header) in headers.iter().enumerate() {
            want.push_str(header);
            let mut keys: Vec<(u32, BackfillSeries)> = (0..series)
                .map(|k| (k, (k / 7, (k % 7 != 0).then_some(k % 7))))
                .collect();
            keys.sort_by_key(|(_, key)| *key);
            for (k, _) in keys {
                for t in 0..ticks {
                    want.push_str(&format!("f{f}{{s=\"{k}\"}} {t} {t}.000\n"));
                }
            }
        }
        assert!(out == want, "{} bytes, {} wanted", out.len(), want.len());
    }
}
