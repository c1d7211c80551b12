//! `gpuwatch record`: a timestamped CSV log of every metric (format in [`crate::record`]), to
//! stdout or a rotating file, on an absolute tick schedule (late ticks are skipped, never made up
//! in a burst), written at least every second (short ticks together), ended cleanly by Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::GlobalArgs;
use crate::pipeline::SamplerThread;
use crate::record::{Batched, CsvRows, RotatingFile, Sink};
use crate::sampler::Sampler;

/// Arguments of `record`.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Time between ticks (`100ms` at least; `1s`, `2.5s`, `1m`, …).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Stop after this long (default: until Ctrl-C / SIGTERM). With --speed, time of the
    /// scenario, as --interval is.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Write to this file instead of stdout (`-`: stdout). A symbolic link is followed; a
    /// device or FIFO is written in place, never rotated.
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Start a new file (FILE → FILE.1 → FILE.2 …) before FILE would grow past this size
    /// (bytes, or `100MB`, `64MiB`, `1G`, …). Needs --out.
    #[arg(long, value_parser = crate::values::parse_size, requires = "out")]
    pub max_size: Option<u64>,
    /// How many rotated files to keep.
    #[arg(long, default_value_t = 5)]
    pub keep: usize,
    /// How often the GPU process list is refreshed (process lists are slow on real drivers).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub process_interval: Duration,
    /// How often a GPU's GPM sample is taken (Hopper and later; each value is the mean between
    /// two samples, written at every tick until the next): `0s` = at every tick. A sample costs
    /// the driver hundreds of µs of CPU per GPU (an estimate until measured on a Hopper GPU).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub gpm_interval: Duration,
    /// At the end, print on stderr how the schedule was kept: ticks taken and skipped, and the
    /// wall time of each sample (median, p99, max).
    #[arg(long)]
    pub stats: bool,
}

use crate::values::parse_duration;

/// A sampling interval for `--interval`: the config's grammar and bounds (100 ms to 1 h).
fn parse_interval(s: &str) -> Result<Duration, String> {
    crate::values::parse_interval_ms(s).map(|ms| Duration::from_millis(ms.unsigned_abs()))
}

/// Runs `record`: the pipeline's sampler thread, each snapshot written as one CSV tick.
pub fn run(global: &GlobalArgs, args: &RecordArgs) -> anyhow::Result<i32> {
    let mut cfg = global.sampler_config();
    cfg.process_interval = args.process_interval;
    cfg.gpm_interval = args.gpm_interval;
    let sampler = Sampler::open(&cfg)?;

    if args.max_size.is_some() && args.out.as_ref().is_some_and(|p| p.as_os_str() == "-") {
        anyhow::bail!("--max-size rotates files: it needs --out FILE, not standard output");
    }
    let mut sink = match args.out.as_ref().filter(|p| p.as_os_str() != "-") {
        Some(path) => Sink::File(
            RotatingFile::open(path, args.max_size, args.keep)
                .with_context(|| format!("opening {}", path.display()))?,
        ),
        None => Sink::Stream(Box::new(std::io::BufWriter::new(std::io::stdout()))),
    };
    sink.start()?;
    // Under --speed the interval and the duration are the scenario's: a 1 s interval at
    // --speed 30 is a tick every 1/30 s of wall time (a 3 s stall is seen as it is, not aliased
    // by 30 s steps).
    let interval =
        crate::sys::wall_interval(args.interval, "--interval").map_err(anyhow::Error::msg)?;
    let duration = args.duration.map(|d| d.div_f64(crate::sys::clock_speed()));
    let sink = Batched::new(sink, interval);
    // Handlers first: the sampling thread writes the first tick at once, and a signal sent as
    // soon as output appears must end the recording cleanly (signals wait in the iterator).
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    let start = Instant::now();
    // Each snapshot is rendered and written on the sampling thread: no hand-off per tick, and
    // a writer that cannot keep up (a full pipe, a stalled disk) makes ticks late (skipped and
    // counted) instead of queueing snapshots without bound. Short ticks are written together,
    // none held longer than a second (`Batched`).
    let sink = Arc::new(Mutex::new(sink));
    let failed: Arc<Mutex<Option<anyhow::Error>>> = Arc::default();
    let mut thread = {
        let (sink, failed) = (sink.clone(), failed.clone());
        let mut rows = CsvRows::new();
        let mut buf = String::with_capacity(4096);
        SamplerThread::start_with(
            sampler,
            interval,
            duration.map(|d| start + d),
            args.stats,
            move |snap| {
                buf.clear();
                rows.render(&snap, &mut buf);
                let written = match sink.lock() {
                    Ok(mut s) => s.push(&buf).context("writing the recording"),
                    Err(_) => Err(anyhow::anyhow!("the recording's writer failed")),
                };
                match written {
                    Ok(()) => true,
                    Err(e) => {
                        if let Ok(mut f) = failed.lock() {
                            *f = Some(e);
                        }
                        false
                    }
                }
            },
        )
    };

    // A signal stops the sampler thread; the recording ends after the tick in progress. A
    // sampling thread stuck in an NVML call that never returns (a wedged driver) cannot end its
    // tick: after STUCK_GRACE the command exits without it (every tick before is written).
    const STUCK_GRACE: Duration = Duration::from_secs(5);
    let stopped_by = Arc::new(AtomicI32::new(0));
    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handle = signals.handle();
    {
        let stop = thread.stop_signal();
        let sink_at_exit = sink.clone();
        let stopped_by = stopped_by.clone();
        let ended = ended.clone();
        std::thread::Builder::new()
            .name("gpuwatch-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    stopped_by.store(sig, Ordering::SeqCst);
                    stop.stop();
                    let deadline = std::time::Instant::now() + STUCK_GRACE;
                    while std::time::Instant::now() < deadline {
                        if ended.load(Ordering::SeqCst) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    // (the sampling thread holds the writer only while it writes, never
                    // inside NVML; a write that blocks — a paused pipe reader, a stalled disk —
                    // must not keep this exit from happening)
                    if let Ok(mut s) = sink_at_exit.try_lock() {
                        let _ = s.flush();
                    }
                    eprintln!(
                        "gpuwatch record: the sampler is stuck in an NVML call (a wedged driver); exiting without it, every tick before is written"
                    );
                    std::process::exit(128 + sig);
                }
            })
            .context("starting the signal thread")?;
    }

    let joined = thread.join();
    ended.store(true, Ordering::SeqCst);
    handle.close();
    joined?;
    if let Some(e) = failed.lock().ok().and_then(|mut f| f.take()) {
        return Err(e);
    }
    if args.stats {
        let s = thread.stats();
        let due = s.taken + s.missed;
        #[expect(clippy::cast_precision_loss, reason = "tick counts")]
        let kept = if due == 0 {
            100.0
        } else {
            s.taken as f64 * 100.0 / due as f64
        };
        let ms = |q| {
            s.quantile_ms(q)
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
        };
        eprintln!(
            "gpuwatch record: {} ticks taken, {} skipped ({kept:.1} % kept); sample wall time median {} ms, p99 {} ms, max {} ms; {} GPUs",
            s.taken,
            s.missed,
            ms(0.5),
            ms(0.99),
            ms(1.0),
            thread.devices().len()
        );
    }
    let mut sink = sink
        .lock()
        .map_err(|_| anyhow::anyhow!("the recording's writer failed"))?;
    sink.flush().context("writing the recording")?;
    if let Sink::File(f) = sink.sink_mut() {
        f.sync().context("syncing the recording")?;
    }
    match stopped_by.load(Ordering::SeqCst) {
        0 => {}
        sig => tracing::info!("stopped by signal {sig}"),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::parse_size;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        // One grammar with the config file: `1sec` is not a duration anywhere.
        assert!(parse_duration("1sec").is_err());
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
