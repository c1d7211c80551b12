//! Issue 14 §1 (part): `gpuwatch daemon` with `[exporter] listen` serves `/metrics` under
//! dcgm-exporter's names and labels plus `gpuwatch_alerts`, `/-/healthy`, `/-/ready`; the page
//! passes `promtool check metrics` (Debian's `prometheus` package, installed by `.ci/run`); a
//! port already taken is said once and the daemon keeps alerting.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::daemon::daemon;
use super::notify::servers::{free_port, wait_until};

/// `GET path` with `accept`: (status, content type, body).
pub(super) fn get(port: u16, path: &str, accept: &str) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    Some((status, ctype, body.to_string()))
}

fn config(dir: &Path, listen: &str) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            "[daemon]\ninterval = \"1s\"\nstate_dir = \"state\"\nrules = [{rules:?}]\nhostname = \"simhost\"\n\n\
             [exporter]\nlisten = \"{listen}\"\n",
            rules = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .display()
                .to_string(),
        ),
    )
    .expect("config");
    path
}

#[test]
fn daemon_serves_dcgm_compatible_metrics() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = config(tmp.path(), &format!("127.0.0.1:{port}"));
    let d = daemon("xid-79", &cfg, &tmp.path().join("log"), &[]);
    let (status, _, _) = wait_until(Duration::from_secs(20), "/-/healthy", || {
        get(port, "/-/healthy", "*/*")
    });
    assert_eq!(status, 200);
    wait_until(Duration::from_secs(20), "/-/ready", || {
        get(port, "/-/ready", "*/*").filter(|r| r.0 == 200)
    });
    // xid-79 drops GPU 3 off the bus at 30 s of scenario time; wait for gpu_lost to fire.
    let (_, ctype, page) = wait_until(Duration::from_secs(60), "gpu_lost in /metrics", || {
        get(port, "/metrics", "text/plain")
            .filter(|r| r.2.contains("gpuwatch_alerts{alertname=\"gpu_lost\""))
    });
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    // The names the public "NVIDIA DCGM Exporter Dashboard" (Grafana 12239) queries —
    // temperature, power, SM clock, utilization, framebuffer used, and its profiling panels
    // (tensor core, SM active, DRAM active: from GPM on these H100s) — and the other GPU panels'
    // usual ones.
    for name in [
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_XID_ERRORS",
    ] {
        assert!(
            page.contains(&format!("\n{name}{{")),
            "{name} missing:\n{page}"
        );
    }
    let util_rows = page
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
        .count();
    assert!(util_rows >= 7, "one row per answering GPU: {util_rows}");
    // DCGM's profiling activities are ratios 0–1 (gpuwatch keeps percentages)
    let sm: Vec<f64> = page
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_PROF_SM_ACTIVE{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(
        sm.len() >= 7 && sm.iter().all(|v| (0.5..=1.0).contains(v)),
        "SM active of busy H100s as a ratio: {sm:?}"
    );
    assert!(
        page.contains("Hostname=\"simhost\"") && page.contains("modelName=\""),
        "{page}"
    );
    for own in [
        "gpuwatch_build_info{",
        "gpuwatch_sample_duration_seconds{",
        "gpuwatch_ticks_total{result=\"taken\"",
        "gpuwatch_rule_evaluations_total{result=\"ran\"",
        "gpuwatch_silences_active{",
        "gpuwatch_rule_evaluation_seconds_total{",
        "gpuwatch_notifications_queued{",
    ] {
        assert!(page.contains(own), "{own} missing:\n{page}");
    }
    // GPU 3 answers "GPU is lost": the failed calls are counted per function.
    let errors: f64 = page
        .lines()
        .filter(|l| l.starts_with("gpuwatch_nvml_call_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(errors >= 1.0, "NVML errors counted:\n{page}");
    assert!(
        page.contains("gpuwatch_nvml_call_timeouts_total{function=\"nvmlDeviceGetFieldValues\""),
        "{page}"
    );
    // OpenMetrics when asked.
    let (_, ctype, om) = get(
        port,
        "/metrics",
        "application/openmetrics-text; version=1.0.0",
    )
    .expect("OpenMetrics scrape");
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert!(om.ends_with("# EOF\n"), "{om}");
    // promtool's linter (CI installs Debian's prometheus package).
    let problems = promtool_problems(&page);
    assert!(
        problems.is_empty(),
        "promtool check metrics: {problems:?}\n{page}"
    );
    assert_eq!(get(port, "/nope", "*/*").map(|r| r.0), Some(404));
    drop(d);
}

#[test]
fn a_taken_exporter_port_does_not_stop_alerting() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let cfg = config(tmp.path(), &format!("127.0.0.1:{port}"));
    let log = tmp.path().join("log");
    let d = daemon("healthy", &cfg, &log, &[]);
    let text = wait_until(Duration::from_secs(20), "the exporter's complaint", || {
        let t = std::fs::read_to_string(&log).unwrap_or_default();
        t.contains("alerting goes on without /metrics").then_some(t)
    });
    assert!(text.contains(&port.to_string()), "{text}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        Path::new(&format!("/proc/{}", d.pid())).exists(),
        "the daemon runs on: {}",
        d.log_text()
    );
    drop(d);
    drop(taken);
}

/// `gpuwatch export --openmetrics` turns a log into OpenMetrics that promtool backfills into a
/// TSDB block: the log's GPUs appear under dcgm-exporter's names with the log's own times.
#[test]
fn recordings_backfill_into_prometheus_blocks() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let log = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logs/smi-csv-units.csv");
    let om = tmp.path().join("rec.om");
    let run = super::common::gpuwatch(
        &[
            "export",
            "--openmetrics",
            log.to_str().expect("utf-8"),
            "--hostname",
            "old-node",
            "--out",
            om.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let text = std::fs::read_to_string(&om).expect("the export");
    assert!(text.ends_with("# EOF\n"));
    let util: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
        .collect();
    assert_eq!(util.len(), 20, "10 ticks x 2 GPUs");
    assert!(
        util[0].ends_with(" 1714557600.123"),
        "the log's own time: {}",
        util[0]
    );
    // The same family is not split: one TYPE line per family.
    assert_eq!(text.matches("# TYPE DCGM_FI_DEV_GPU_UTIL ").count(), 1);
    let Some(promtool) = super::common::installed(&["promtool"]) else {
        return;
    };
    let out = std::process::Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om)
        .arg(tmp.path().join("blocks"))
        .output()
        .expect("promtool tsdb create-blocks-from");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // `tsdb dump` reads a database directory, which has a WAL; the backfilled blocks do not.
    std::fs::create_dir_all(tmp.path().join("blocks/wal")).expect("wal dir");
    let dump = std::process::Command::new(&promtool)
        .args(["tsdb", "dump"])
        .arg(tmp.path().join("blocks"))
        .output()
        .expect("promtool tsdb dump");
    let dump = String::from_utf8_lossy(&dump.stdout);
    let series: std::collections::BTreeSet<&str> = dump
        .lines()
        .filter(|l| l.contains("__name__=\"DCGM_FI_DEV_GPU_UTIL\""))
        .filter_map(|l| l.split("gpu=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(series.len(), 2, "both GPUs in the block: {dump:.2000}");
    assert!(dump.contains("Hostname=\"old-node\""), "{dump:.2000}");
}

/// `gpuwatch run` serves `/metrics` too while the job runs: the job's step and the age of its
/// progress, and an NVML call that hangs on one GPU is counted as a timeout of its function.
#[test]
fn run_serves_job_progress_and_nvml_timeouts() {
    super::common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = config(tmp.path(), &format!("127.0.0.1:{port}"));
    let mut child = super::common::command(
        &[
            "--sim",
            "healthy",
            "run",
            "--no-report",
            "--quiet",
            "--config",
            cfg.to_str().expect("utf-8"),
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 200 ]; do i=$((i+1)); echo \"step $i/200\"; sleep 0.1; done",
        ],
        &[("NVML_SIM_HANG", "gpu=2,at_s=1,function=*")],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .expect("gpuwatch run");
    let page = wait_until(Duration::from_secs(20), "job step and a timeout", || {
        let (_, _, page) = get(port, "/metrics", "text/plain")?;
        let step = page
            .lines()
            .find(|l| l.starts_with("gpuwatch_job_step{"))?
            .rsplit(' ')
            .next()?
            .parse::<f64>()
            .ok()?;
        let timeouts: f64 = page
            .lines()
            .filter(|l| l.starts_with("gpuwatch_nvml_call_timeouts_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        (step >= 5.0 && timeouts >= 1.0).then_some(page)
    });
    let age: f64 = page
        .lines()
        .find(|l| l.starts_with("gpuwatch_job_progress_age_seconds{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .expect("progress age");
    assert!(age < 5.0, "progress moves every 0.1 s: {age}\n{page}");
    assert!(page.contains("job=\"sh -c "), "{page}");
    let _ = child.kill();
    let _ = child.wait();
}

/// GPUs of a process round whose process-list call hangs on one GPU: the other GPUs' processes
/// are served at every scrape, and the hung GPU's last list is carried while fresh (two process
/// intervals and the call timeout: 11 s by default), then absent — never an empty list at once,
/// which would resolve its process alerts.
#[test]
fn a_hung_process_list_is_carried_while_fresh() {
    super::common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = config(tmp.path(), &format!("127.0.0.1:{port}"));
    let d = daemon(
        "healthy",
        &cfg,
        &tmp.path().join("log"),
        &[(
            "NVML_SIM_HANG",
            "gpu=2,at_s=2,function=nvmlDeviceGetComputeRunningProcesses_v3",
        )],
    );
    let gpus_with_processes = || -> Option<std::collections::BTreeSet<String>> {
        let (_, _, page) = get(port, "/metrics", "text/plain")?;
        Some(
            page.lines()
                .filter(|l| l.starts_with("gpuwatch_gpu_process_memory_bytes{"))
                .filter_map(|l| l.split("gpu=\"").nth(1)?.split('"').next())
                .map(str::to_string)
                .collect(),
        )
    };
    let all: std::collections::BTreeSet<String> = (0..8).map(|g| g.to_string()).collect();
    wait_until(Duration::from_secs(20), "processes on every GPU", || {
        (gpus_with_processes()? == all).then_some(())
    });
    let start = std::time::Instant::now();
    let mut gone_at = None;
    while start.elapsed() < Duration::from_secs(25) && gone_at.is_none() {
        if let Some(seen) = gpus_with_processes() {
            let others: Vec<&String> = all.iter().filter(|g| *g != "2").collect();
            assert!(
                others.iter().all(|g| seen.contains(*g)),
                "{seen:?} at {:?}\n{}",
                start.elapsed(),
                d.log_text()
            );
            if !seen.contains("2") {
                gone_at = Some(start.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Rounds at 0, 5, 10, 15 s of the daemon's time; the hang from the 5 s round on: GPU 2's
    // list of the 0 s round is carried through the 5 and 10 s rounds, dropped at the 15 s one.
    let gone_at = gone_at.expect("GPU 2's processes end once stale");
    assert!(
        gone_at >= Duration::from_secs(7),
        "GPU 2's processes dropped after {gone_at:?}: not carried\n{}",
        d.log_text()
    );
}

/// Clients that open connections to `/metrics` and send nothing cannot take the daemon's file
/// descriptors (its state, outbox and sockets need them): at most 64 are kept open, and the page
/// is served again once they are gone.
#[test]
fn idle_connections_are_bounded() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = config(tmp.path(), &format!("127.0.0.1:{port}"));
    let d = daemon("healthy", &cfg, &tmp.path().join("log"), &[]);
    wait_until(Duration::from_secs(20), "/-/ready", || {
        get(port, "/-/ready", "*/*").filter(|r| r.0 == 200)
    });
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", d.pid())).map_or(0, |r| r.count());
    let before = fds();
    let idle: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert!(idle.len() > 100, "{}", idle.len());
    std::thread::sleep(Duration::from_secs(1));
    let during = fds();
    assert!(
        during <= before + 70,
        "{during} file descriptors with 200 idle clients ({before} before)"
    );
    drop(idle);
    wait_until(Duration::from_secs(10), "/metrics again", || {
        get(port, "/metrics", "text/plain").filter(|r| r.0 == 200)
    });
}

/// `GET /metrics` as Prometheus sends it (connect, the whole head at once), all within `limit`:
/// the time it took, or why it failed.
fn scrape_within(port: u16, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let left = || {
        limit
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(1))
    };
    let mut s = TcpStream::connect_timeout(&(std::net::Ipv4Addr::LOCALHOST, port).into(), limit)
        .map_err(|e| format!("connect: {e}"))?;
    s.write_all(
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\nConnection: close\r\n\r\n",
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        s.set_read_timeout(Some(left()))
            .map_err(|e| format!("{e}"))?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => {
                return Err(format!(
                    "read after {:?} ({} bytes): {e}",
                    start.elapsed(),
                    raw.len()
                ))
            }
        }
    }
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&raw);
    if !text.starts_with("HTTP/1.1 200") || !text.contains("DCGM_FI_DEV_") {
        return Err(format!(
            "not a page ({} bytes): {:?}",
            raw.len(),
            text.chars().take(200).collect::<String>()
        ));
    }
    if took > limit {
        return Err(format!("answered after {took:?}"));
    }
    Ok(took)
}

/// `count` slow clients until `stop`: even ones connect and send nothing, odd ones send the start
/// of a request head and then one byte every 2 s. A connection the server closes is opened again
/// half a second later.
fn slow_clients(port: u16, count: usize, stop: &AtomicBool) {
    let addr = (std::net::Ipv4Addr::LOCALHOST, port).into();
    let mut slots: Vec<(Option<TcpStream>, Instant)> =
        (0..count).map(|_| (None, Instant::now())).collect();
    while !stop.load(Ordering::SeqCst) {
        for (i, (slot, due)) in slots.iter_mut().enumerate() {
            let now = Instant::now();
            match slot {
                None if now >= *due => {
                    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                    else {
                        *due = now + Duration::from_millis(500);
                        continue;
                    };
                    let ok = s.set_nonblocking(true).is_ok()
                        && (i % 2 == 0 || s.write_all(b"GET /metrics HTTP/1.1\r\nHo").is_ok());
                    if ok {
                        *slot = Some(s);
                        *due = now + Duration::from_secs(2);
                    } else {
                        *due = now + Duration::from_millis(500);
                    }
                }
                None => {}
                Some(s) => {
                    let mut byte = [0u8; 1];
                    let open = matches!(s.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
                    let open =
                        open && (i % 2 == 0 || now < *due || s.write(b"s").is_ok_and(|n| n == 1));
                    if !open {
                        *slot = None;
                        *due = now + Duration::from_millis(500);
                    } else if i % 2 == 1 && now >= *due {
                        *due = now + Duration::from_secs(2);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 25 item 6: slow clients (slowloris: 300 of them, each connecting and then sending
/// nothing or a byte of a request head every 2 s, and connecting again when closed) cannot blind
/// `/metrics`: every scrape is answered within 1 s, and the daemon's file descriptors stay
/// bounded.
#[test]
fn scrapes_are_answered_while_slow_clients_hold_connections() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = config(tmp.path(), &format!("127.0.0.1:{port}"));
    let d = daemon("healthy", &cfg, &tmp.path().join("log"), &[]);
    wait_until(Duration::from_secs(20), "a first page", || {
        scrape_within(port, Duration::from_secs(1)).ok()
    });
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", d.pid())).map_or(0, |r| r.count());
    let before = fds();
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || slow_clients(port, 100, &stop))
        })
        .collect();
    // Let them take every connection the server allows.
    std::thread::sleep(Duration::from_millis(1500));
    let mut answers = Vec::new();
    let mut most_fds = 0;
    // 12 scrapes over 9 s: past the header timeout, while the slow clients are cut off and
    // come back.
    for _ in 0..12 {
        answers.push(scrape_within(port, Duration::from_secs(1)));
        most_fds = most_fds.max(fds());
        std::thread::sleep(Duration::from_millis(600));
    }
    stop.store(true, Ordering::SeqCst);
    for a in attackers {
        a.join().expect("slow clients");
    }
    eprintln!("scrapes: {answers:?}; file descriptors: {before} before, at most {most_fds}");
    // The attack is real: the slow clients hold connections (the server's cap is 64).
    assert!(
        most_fds >= before + 32,
        "{most_fds} file descriptors with 300 slow clients ({before} before)"
    );
    let failed: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} scrapes failed with 300 slow clients: {failed:?}\n{answers:?}",
        failed.len(),
        answers.len()
    );
    assert!(
        most_fds <= before + 100,
        "{most_fds} file descriptors with 300 slow clients ({before} before)"
    );
}

/// A connection is held only while it is useful: one that sends nothing, one that trickles a
/// request head a byte a second, and a kept-alive one idle after its response are each closed by
/// the server within seconds (the header timeout), not after the whole connection limit.
#[test]
fn slow_and_idle_connections_are_closed_within_seconds() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = config(tmp.path(), &format!("127.0.0.1:{port}"));
    let _d = daemon("healthy", &cfg, &tmp.path().join("log"), &[]);
    wait_until(Duration::from_secs(20), "a first page", || {
        scrape_within(port, Duration::from_secs(1)).ok()
    });
    /// Seconds until the server closes `s` (`None`: not within 12 s), sending `tick` each second.
    fn closed_after(mut s: TcpStream, tick: &[u8]) -> Option<Duration> {
        let start = Instant::now();
        s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        let mut buf = [0u8; 4096];
        while start.elapsed() < Duration::from_secs(12) {
            match s.read(&mut buf) {
                Ok(0) => return Some(start.elapsed()),
                Ok(_) => {}
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    if !tick.is_empty() && s.write_all(tick).is_err() {
                        return Some(start.elapsed());
                    }
                }
                Err(_) => return Some(start.elapsed()),
            }
        }
        None
    }
    let connect = || TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let silent = connect();
    let mut trickle = connect();
    trickle
        .write_all(b"GET /metrics HTTP/1.1\r\nHo")
        .expect("send");
    // A whole request on a kept-alive connection, read up to the end of the response's head (the
    // rest is read, and the close seen, by `closed_after`).
    let mut kept = connect();
    kept.write_all(b"GET /-/healthy HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("send");
    let silent = std::thread::spawn(move || closed_after(silent, b""));
    let trickle = std::thread::spawn(move || closed_after(trickle, b"s"));
    let kept = std::thread::spawn(move || closed_after(kept, b""));
    for (what, t) in [
        ("silent", silent),
        ("trickling", trickle),
        ("kept-alive", kept),
    ] {
        let after = t.join().expect("client");
        assert!(
            after.is_some_and(|a| a < Duration::from_secs(9)),
            "a {what} connection closed after {after:?}"
        );
    }
}

/// What `promtool check metrics` (when installed: CI installs Debian's prometheus package) finds
/// wrong with `page`, beyond dcgm-exporter's own names: they break three of promtool's style
/// rules (camelCase labels `UUID`, `modelName`, `Hostname`; counters without `_total`;
/// `…_COUNTER` in a name) and its dashboards need them as they are. Everything else —
/// gpuwatch's own families, syntax, duplicates, HELP and TYPE — must pass.
pub(crate) fn promtool_problems(page: &str) -> Vec<String> {
    let Some(promtool) = super::common::installed(&["promtool"]) else {
        return Vec::new();
    };
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    said.lines()
        .filter(|l| {
            !(l.starts_with("DCGM_FI_")
                && (l.contains("label names should be written in 'snake_case'")
                    || l.contains("counter metrics should have \"_total\" suffix")
                    || l.contains("metric name should not include type")))
        })
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}
