//! `gpuwatch export --openmetrics`: any log `import` reads, as OpenMetrics under dcgm-exporter's
//! names with timestamps, for `promtool tsdb create-blocks-from openmetrics` — last month's logs
//! in Grafana beside live data.
//!
//! OpenMetrics wants each family's samples together (and each series in time order), while a
//! log is a sequence of ticks; samples are spooled to one temporary file per family and series
//! (a GPU, or one of its MIG devices), so memory stays bounded whatever the log's length, and
//! joined at the end.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write as _};
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
    let mut parts: BTreeMap<(usize, BackfillSeries), BufWriter<std::fs::File>> = BTreeMap::new();
    let mut failed: Option<std::io::Error> = None;
    let mut ticks = 0u64;
    let mut last_ms = i64::MIN;
    for f in &args.files {
        let importer = crate::import::Importer::open(f, &args.log.options())?;
        let stats = importer.stats();
        let mut behind = 0u64;
        for tick in crate::import::read_ahead(importer) {
            let tick = tick?;
            // One time line: a backfill cannot take a series going back in time.
            if tick.snapshot.time_ms <= last_ms {
                behind += 1;
                continue;
            }
            last_ms = tick.snapshot.time_ms;
            ticks += 1;
            crate::exporter::backfill(&tick.snapshot, &host, |family, series, line| {
                if failed.is_some() {
                    return;
                }
                let w = match parts.entry((family, series)) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        match std::fs::File::create(spool.part(family, series)) {
                            Ok(file) => e.insert(BufWriter::new(file)),
                            Err(err) => {
                                failed = Some(err);
                                return;
                            }
                        }
                    }
                };
                if let Err(err) = writeln!(w, "{line}") {
                    failed = Some(err);
                }
            });
            if let Some(e) = failed.take() {
                return Err(e).context("spooling samples");
            }
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
    let mut current = None;
    for ((family, series), w) in parts {
        let file = w
            .into_inner()
            .map_err(|e| e.into_error())
            .context("spooling samples")?;
        drop(file);
        if current != Some(family) {
            out.write_all(headers[family].as_bytes())?;
            current = Some(family);
        }
        let mut part = std::fs::File::open(spool.part(family, series))?;
        std::io::copy(&mut part, &mut out)?;
    }
    out.write_all(b"# EOF\n")?;
    out.finish()?;
    eprintln!("exported {ticks} ticks as OpenMetrics");
    Ok(0)
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
    fn part(&self, family: usize, series: BackfillSeries) -> PathBuf {
        self.0.join(match series {
            (gpu, None) => format!("{family}-{gpu}"),
            (gpu, Some((gi, ci))) => format!("{family}-{gpu}-{gi}-{ci}"),
        })
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
