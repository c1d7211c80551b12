//! What a thread's wake-up costs on this machine: the unit gpuwatch's idle CPU is made of.
//!
//!     cargo run --release --example wake [-- INTERVAL_MS [CYCLES]]     (defaults: 100, 300)
//!
//! Three loops of CYCLES cycles, one every INTERVAL_MS, each measured as the CPU time of every
//! thread of the process (the kernel's per-thread schedstat) divided by the cycles:
//! * `sleep`: a thread sleeps until the next cycle — one timer wake-up (what the floor's loop
//!   pays per tick);
//! * `sleep + hand-off`: the same, then it hands a message to a second thread and waits for its
//!   answer — one timer wake-up and two thread wake-ups (what a sampling thread that asks a
//!   worker for the devices' reads pays per tick);
//! * `hand-off only`: the hand-off without the timer (both threads hot).
//!
//! On an idle 2-core VM a timer wake-up costs tens of µs of CPU, a hand-off much less: a
//! daemon's figure per second is mostly how many times its threads wake, which is why gpuwatch
//! counts wake-ups per thread (`bench/daemon.py`).

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// CPU time of every thread of this process so far, µs.
fn cpu_us() -> f64 {
    let mut total = 0.0;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let stat = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            let ns: f64 = stat
                .split_whitespace()
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0.0);
            total += ns / 1000.0;
        }
    }
    total
}

fn main() {
    let mut args = std::env::args().skip(1);
    let interval = Duration::from_millis(args.next().and_then(|a| a.parse().ok()).unwrap_or(100));
    let cycles: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let (ask, asked) = mpsc::channel::<u32>();
    let (answer, answers) = mpsc::channel::<u32>();
    std::thread::spawn(move || {
        while let Ok(x) = asked.recv() {
            if answer.send(x).is_err() {
                break;
            }
        }
    });
    let hand_off = |i: u32| {
        ask.send(i).expect("the worker thread runs");
        answers.recv().expect("the worker thread answers");
    };
    hand_off(0);
    let run = |name: &str, timer: bool, handoff: bool| {
        let c0 = cpu_us();
        let t0 = Instant::now();
        for i in 0..cycles {
            if timer {
                let due = t0 + interval * (i + 1);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            if handoff {
                hand_off(i);
            }
        }
        let per = (cpu_us() - c0) / f64::from(cycles);
        println!("{name:<18} {per:6.1} µs of CPU per cycle");
    };
    println!(
        "{cycles} cycles every {} ms, CPU of all threads:",
        interval.as_millis()
    );
    run("sleep", true, false);
    run("sleep + hand-off", true, true);
    run("hand-off only", false, true);
}
