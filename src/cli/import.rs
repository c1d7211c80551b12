//! `gpuwatch import`: any GPU log gpuwatch reads, converted to gpuwatch's CSV; and the log
//! options every command that reads logs shares (`replay`, `import`).

use std::io::Write as _;
use std::path::PathBuf;

use crate::sys::output::{Dash, Output};

use super::GlobalArgs;
use crate::import::{Format, ImportOptions, Importer};

/// How to read a log: shared by every command that reads one.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// The log's format (detected when not given): gpuwatch, smi-csv, smi-table, dmon,
    /// dcgmi-dmon, dcgm-exporter, script-rows, script-bars, script-progress.
    #[arg(long, value_name = "NAME", value_parser = parse_format)]
    pub format: Option<Format>,
    /// Header line for an nvidia-smi log written with `noheader`, e.g.
    /// "timestamp, index, utilization.gpu [%], memory.used [MiB]".
    #[arg(long, value_name = "HEADER")]
    pub smi_header: Option<String>,
    /// Start time for timestamps that count seconds from the start, and for logs without
    /// timestamps (dmon without -o DT, dcgm-exporter scrapes): RFC 3339
    /// (`2024-05-01T10:00:00Z`) or nvidia-smi's form.
    #[arg(long, value_name = "TIME", value_parser = parse_t0)]
    pub t0: Option<i64>,
    /// GPUs per sampling burst in a log without an index, UUID or bus-id column (default:
    /// rows within 50 ms of each other are one burst).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub gpus: Option<u32>,
    /// Time between samples of a log without timestamps (dmon's -d, the time between
    /// scrapes), default 1s.
    #[arg(long, value_name = "DURATION", value_parser = crate::values::parse_duration)]
    pub every: Option<std::time::Duration>,
    /// What a CSV log's columns hold: names in column order for a log without a header
    /// (`timestamp,gpu,util,mem_used,power`; `-` skips one), or `NAME=metric` pairs for header
    /// columns (`mem=mem_used,vram=mem_total`). Names as in docs/metrics.md; a unit suffix
    /// says the unit (`mem_used_GB`).
    #[arg(long, value_name = "SPEC", value_parser = crate::import::columns::ColumnSpec::parse)]
    pub columns: Option<crate::import::columns::ColumnSpec>,
    /// Time zone of a log's times written without one: a fixed offset (`+08:00`, `-0500`) or a
    /// zone name (UTC, GMT, EST, EDT, CST, CDT, MST, MDT, PST, PDT, CET, CEST, BST, IST, JST,
    /// KST, …); also the reading of an ambiguous name in the log (CST is US Central unless
    /// --tz says otherwise). Default UTC.
    #[arg(long, value_name = "ZONE", value_parser = parse_tz)]
    pub tz: Option<i32>,
}

fn parse_tz(s: &str) -> Result<i32, String> {
    crate::import::stamp::parse_tz(s).ok_or_else(|| {
        format!("`{s}` is not a time zone gpuwatch knows (try +08:00, -05:00, UTC, EDT, CET, JST)")
    })
}

fn parse_format(s: &str) -> Result<Format, String> {
    Format::from_name(s).ok_or_else(|| {
        format!(
            "unknown format `{s}` (one of {})",
            Format::ALL.map(Format::name).join(", ")
        )
    })
}

fn parse_t0(s: &str) -> Result<i64, String> {
    match crate::import::stamp::parse(s) {
        Some(crate::import::stamp::Stamp::At(ms)) => Ok(ms),
        Some(crate::import::stamp::Stamp::Number(n)) if n >= 1e8 => {
            crate::import::stamp::Stamp::Number(n)
                .resolve(None)
                .map_err(str::to_string)
        }
        _ => Err(format!(
            "`{s}` is not a time (try 2024-05-01T10:00:00Z or epoch seconds)"
        )),
    }
}

impl LogArgs {
    /// The importer options these arguments ask for.
    pub fn options(&self) -> ImportOptions {
        ImportOptions {
            format: self.format,
            smi_header: self.smi_header.clone(),
            t0_ms: self.t0,
            gpus: self.gpus,
            every_ms: self
                .every
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            columns: self.columns.clone(),
            tz: self.tz,
        }
    }
}

/// Arguments of `import`.
#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// Logs to convert, read one after another (each format detected on its own).
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Where to write gpuwatch's CSV (standard output when not given).
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// How to read the logs.
    #[command(flatten)]
    pub log: LogArgs,
}

/// Runs `import`: exit 0 (with warnings on standard error when lines were skipped).
pub fn run(_global: &GlobalArgs, args: &ImportArgs) -> anyhow::Result<i32> {
    let opts = args.log.options();
    let mut importers = Vec::new();
    for f in &args.files {
        importers.push(Importer::open(f, &opts)?);
    }
    let progress = importers.iter().any(Importer::has_progress);
    // A regular file is written beside the target and renamed at the end (an interrupted import
    // leaves no half file under the name asked for); a device, FIFO or socket is written in place.
    let out_path = args.out.clone().unwrap_or_else(|| PathBuf::from("-"));
    let mut out = Output::create(&out_path, Dash::Stdout)?;
    let mut header = crate::record::header_line();
    if progress {
        header.push_str(",progress");
    }
    writeln!(out, "{header}")?;
    let mut buf = String::with_capacity(8192);
    let mut ticks = 0u64;
    let mut segments = 0u32;
    let mut warnings = Vec::new();
    let started = std::time::Instant::now();
    for importer in importers {
        let stats = importer.stats();
        let name = importer.path().to_string();
        let format = importer.format();
        // Each file starts with no process list of its own (not the previous file's last one).
        let mut rows = crate::record::CsvRows::new();
        let mut last_segment = None;
        let (assembled, mut back) = crate::import::read_ahead(importer);
        for tick in assembled {
            let tick = tick?;
            if last_segment != Some(tick.segment) {
                segments += 1;
                last_segment = Some(tick.segment);
            }
            buf.clear();
            rows.render(&tick.snapshot, &mut buf);
            if progress {
                let mut cell = String::new();
                if let Some(p) = &tick.progress {
                    crate::record::push_field(&mut cell, &p.text);
                }
                for line in buf.lines() {
                    writeln!(out, "{line},{cell}")?;
                }
            } else {
                out.write_all(buf.as_bytes())?;
            }
            back.give(tick.snapshot);
            ticks += 1;
        }
        eprintln!(
            "{name}: {format}, {} lines",
            stats.lines.load(std::sync::atomic::Ordering::Relaxed)
        );
        warnings.extend(stats.warnings(&name));
    }
    out.finish()?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    eprintln!(
        "imported {ticks} ticks{} in {:.2} s",
        if segments > 1 {
            format!(" in {segments} segments")
        } else {
            String::new()
        },
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}
