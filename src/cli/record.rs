//! `gpuwatch record`: a timestamped CSV log of every metric (format in [`crate::record`]), to
//! stdout or a rotating file, on an absolute tick schedule (late ticks are skipped, never made up
//! in a burst), flushed every tick, ended cleanly by Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::GlobalArgs;
use crate::record::{CsvRows, RotatingFile, Sink};
use crate::sampler::{Sampler, Ticker};

/// Arguments of `record`.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Time between ticks (`100ms` at least; `1s`, `2.5s`, `1m`, …).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Stop after this long (default: until Ctrl-C / SIGTERM).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Write to this file instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Start a new file (FILE → FILE.1 → FILE.2 …) before FILE would grow past this size
    /// (bytes, or `100MB`, `64MiB`, `1G`, …). Needs --out.
    #[arg(long, value_parser = parse_size, requires = "out")]
    pub max_size: Option<u64>,
    /// How many rotated files to keep.
    #[arg(long, default_value_t = 5)]
    pub keep: usize,
    /// How often the GPU process list is refreshed (process lists are slow on real drivers).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub process_interval: Duration,
}

/// Parses `100ms`, `1s`, `2.5s`, `3m`, `1h`, `1d`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (try 500ms, 1s, 5m, 2h)"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" | "sec" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        u => {
            return Err(format!(
                "unknown unit `{u}` in `{s}` (use ms, s, m, h or d)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("`{s}`: {e}"))
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) {
        return Err(format!("`{s}` is below the shortest interval, 100ms"));
    }
    Ok(d)
}

/// Parses a size: bytes, or with `K`/`KB` (1000), `KiB` (1024), `M`/`MB`, `MiB`, `G`/`GB`,
/// `GiB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (try 100MB or 1048576)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1_048_576.0,
        "g" | "gb" => 1e9,
        "gib" => 1_073_741_824.0,
        u => return Err(format!("unknown size unit `{u}` in `{s}`")),
    };
    let bytes = n * mult;
    if !(1.0..1e18).contains(&bytes) {
        return Err(format!("`{s}` is not a usable size"));
    }
    Ok(bytes as u64)
}

/// Runs `record`.
pub fn run(global: &GlobalArgs, args: &RecordArgs) -> anyhow::Result<i32> {
    let mut cfg = global.sampler_config();
    cfg.process_interval = args.process_interval;
    let mut sampler = Sampler::open(&cfg)?;

    // Signals wake the tick wait at once; the recording then ends after the current tick.
    let (tx, rx) = mpsc::channel::<i32>();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("gpuwatch-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        })
        .context("starting the signal thread")?;

    let mut sink = match &args.out {
        Some(path) => Sink::File(
            RotatingFile::open(path, args.max_size, args.keep)
                .with_context(|| format!("opening {}", path.display()))?,
        ),
        None => Sink::Stream(Box::new(std::io::BufWriter::new(std::io::stdout()))),
    };
    sink.start()?;
    let mut rows = CsvRows::new();
    let mut buf = String::with_capacity(4096);
    let start = Instant::now();
    let end = args.duration.map(|d| start + d);
    let mut ticker = Ticker::new(start, args.interval);
    let mut stopped_by = None;
    loop {
        let due = ticker.next(Instant::now());
        if end.is_some_and(|e| due >= e) {
            break;
        }
        let wait = due.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(sig) => {
                stopped_by = Some(sig);
                break;
            }
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
        }
        let snap = sampler.sample();
        buf.clear();
        rows.render(&snap, &mut buf);
        sink.write_tick(&buf).context("writing the recording")?;
    }
    handle.close();
    if let Sink::File(f) = &mut sink {
        f.sync().context("syncing the recording")?;
    }
    if ticker.missed() > 0 {
        tracing::warn!("{} late tick(s) skipped", ticker.missed());
    }
    if let Some(sig) = stopped_by {
        tracing::info!("stopped by signal {sig}");
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_interval("50ms").is_err());
        assert!(parse_interval("100ms").is_ok());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100MB"), Ok(100_000_000));
        assert_eq!(parse_size("64MiB"), Ok(64 * 1_048_576));
        assert_eq!(parse_size("1g"), Ok(1_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
    }
}
