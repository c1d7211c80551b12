"""Daemon benchmark driver (run by bench/daemon.sh).

Starts a webhook receiver on 127.0.0.1 (Python http.server, records the arrival time of every
POST), then `gpuwatch --sim SCENARIO daemon` (release build, 8 simulated GPUs, every stock rule,
`interval = "1s"`, default `[rules] eval_interval` (every sample), `group_wait = "0s"`) for
SECONDS, then SIGTERM.

* Notification latency: for every alert received, arrival time minus its `startsAt`, which the
  engine stamps with the time of the sample that tripped the rule (same host clock).
  Goal: <= one poll interval + 200 ms for rules without `hold`.
* CPU: user + system time of the daemon from wait4(), divided by wall time (start-up included).
* The floor (with --floor): `bench/floor.rs` started beside the daemon for the same time, making
  the NVML calls the daemon's sampler makes at the daemon's cadences (1 s ticks, GPM every 10 s,
  the PCIe byte and replay counters left out as the daemon leaves them out while no rule names
  them and /metrics is off) and nothing else: the part of the daemon's CPU the driver's calls
  cost by themselves. Its CPU is counted from WARM_S after its start, like the daemon's steady
  state below; the daemon's figure above includes its start-up.
* Steady state (runs longer than 2 x WARM_S): the daemon's CPU from WARM_S after its start to
  the stop signal, from the kernel's per-thread counters (/proc/PID/task/*/schedstat), as a
  share of a core — the figure to set beside the floor's — and per thread its CPU a second and
  how often it woke a second (voluntary context switches: each is a sleep ended by a timer or
  another thread, the unit most of an idle daemon's CPU comes in; `cargo run --release
  --example wake` measures what one costs on the machine).
* Memory: peak RSS (the kernel's VmHWM of the daemon, read from /proc every second until the stop
  signal) and the last VmRSS, split into its private memory (RssAnon: heap, stacks) and the
  pages of files it maps (RssFile: its own code and the libraries', shared with the page cache;
  the floor's RSS is mostly the libraries'). Not ru_maxrss: it also counts the forked Python
  interpreter between fork and exec (~21 MiB here), which is not gpuwatch's memory.
* `--speed N` runs the daemon on the scenario's clock N times faster (`gpuwatch --speed`), so
  `--seconds 864 --speed 100` is a simulated day: every window full, every hourly and daily
  bucket made. `--exporter` turns `/metrics` on and scrapes it every 15 s, as Prometheus would
  (the floor then reads the counters only `/metrics` asks for too).
"""

import argparse
import datetime
import http.server
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

WARM_S = 10.0

ARRIVALS = []


class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        t = time.time()
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        ARRIVALS.append((t, json.loads(body)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def parse_ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def threads(pid):
    """Per thread (by id): its name, CPU so far (ns) and voluntary context switches so far."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                switches = next(int(line.split()[1]) for line in f
                                if line.startswith("voluntary_ctxt_switches:"))
        except (OSError, ValueError, StopIteration):
            continue
        out[tid] = (name, ns, switches)
    return out


def per_name(before, after, span):
    """Per thread name: µs of CPU and wake-ups a second between two `threads` readings `span`
    seconds apart (a thread started in between counts from its start)."""
    per = {}
    for tid, (name, ns, switches) in after.items():
        _, ns0, sw0 = before.get(tid, (name, 0, 0))
        row = per.setdefault(name, [0.0, 0.0])
        row[0] += (ns - ns0) / 1e3 / span
        row[1] += (switches - sw0) / span
    return per


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(listen):
    """Fetches /metrics once from `listen` (host:port); 1 when it answered."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=5) as r:
            r.read()
        return 1
    except OSError:
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--scenario", default="xid-79")
    ap.add_argument("--gpuwatch", required=True)
    ap.add_argument("--rules", required=True)
    ap.add_argument("--floor", help="bench/floor.rs's executable, run beside the daemon")
    ap.add_argument("--sim-lib", help="the simulated library the floor loads")
    ap.add_argument("--no-gpm", action="store_true",
                    help="run the daemon with --no-gpm (no GPM profiling sample per tick)")
    ap.add_argument("--speed", type=float,
                    help="the scenario's clock this many times faster (e.g. 100: a day in 864 s)")
    ap.add_argument("--exporter", action="store_true",
                    help="serve /metrics and scrape it every 15 s")
    a = ap.parse_args()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    tmp = tempfile.mkdtemp(prefix="gpuwatch-bench-")
    config = os.path.join(tmp, "config.toml")
    listen = f"127.0.0.1:{free_port()}" if a.exporter else None
    with open(config, "w") as f:
        f.write(f"""
[daemon]
interval = "1s"
state_dir = "{tmp}/state"
rules = ["{os.path.abspath(a.rules)}"]

[notify]
rate_limit = {{ max = 0 }}

[[channel]]
name = "ops"
type = "webhook"
url = "http://127.0.0.1:{port}/hook"

[[route]]
channels = ["ops"]
group_by = ["..."]
group_wait = "0s"
""")
        if a.exporter:
            f.write(f"""
[exporter]
listen = "{listen}"
""")
    env = dict(os.environ, GPUWATCH_LOG="info")
    for k in ("NVML_SIM_TIME_SCALE", "NVML_SIM_CONTROL", "GPUWATCH_NVML_LIB"):
        env.pop(k, None)
    log = open(os.path.join(tmp, "daemon.log"), "w")
    start = time.time()
    # scenario "real": the system's own driver (bench/real-gpu.sh on a GPU machine)
    sim = [] if a.scenario == "real" else ["--sim", a.scenario]
    if a.no_gpm:
        sim.append("--no-gpm")
    if a.speed:
        sim += ["--speed", f"{a.speed:g}"]
    # (under --speed the simulated run's state goes where it is told, not to a new /tmp dir)
    state = ["--state-dir", os.path.join(tmp, "sim-state")] if a.speed else []
    proc = subprocess.Popen([a.gpuwatch, *sim, "daemon", "--config", config, *state],
                            env=env, stderr=log, stdout=subprocess.DEVNULL)
    floor = None
    if a.floor and a.scenario != "real":
        fargs = [a.floor, "--interval", "1s", "--gpm-interval", "10s", "--duration",
                 f"{a.seconds}s", "--warm", f"{WARM_S:g}s"]
        if not a.exporter:
            fargs += ["--unread", "pcie_rx,pcie_tx,pcie_replay"]
        if a.sim_lib:
            fargs += ["--nvml-lib", a.sim_lib]
        if a.no_gpm:
            fargs.append("--no-gpm")
        floor = subprocess.Popen(fargs, env=dict(env, NVML_SIM_SCENARIO=a.scenario),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rss_kib = []
    hwm_kib = 0
    anon_kib = [0]
    file_kib = [0]
    scrapes = 0
    last_scrape = time.time()
    warm = None
    while time.time() - start < a.seconds and proc.poll() is None:
        time.sleep(1)
        if warm is None and time.time() - start >= WARM_S and a.seconds > 2 * WARM_S:
            warm = (time.time(), threads(proc.pid),
                    threads(floor.pid) if floor is not None else {})
        if a.exporter and time.time() - last_scrape >= 15:
            last_scrape = time.time()
            scrapes += scrape(listen)
        try:
            with open(f"/proc/{proc.pid}/status") as s:
                for line in s:
                    if line.startswith("VmRSS:"):
                        rss_kib.append(int(line.split()[1]))
                    elif line.startswith("VmHWM:"):
                        hwm_kib = max(hwm_kib, int(line.split()[1]))
                    elif line.startswith("RssAnon:"):
                        anon_kib.append(int(line.split()[1]))
                    elif line.startswith("RssFile:"):
                        file_kib.append(int(line.split()[1]))
        except OSError:
            pass
    steady = {}
    if warm is not None:
        span = time.time() - warm[0]
        per = per_name(warm[1], threads(proc.pid), span)
        floor_wakes = sum(r[1] for r in per_name(
            warm[2], threads(floor.pid) if floor is not None else {}, span).values())
        steady = {
            "steady_seconds": round(span, 1),
            "floor_wakes_per_s": round(floor_wakes, 1) if floor is not None else None,
            "steady_cpu_percent_of_one_core": round(sum(r[0] for r in per.values()) / 1e4, 3),
            "threads": {
                n: f"{r[0]:.0f} us CPU and {r[1]:.1f} wake-ups a second"
                for n, r in sorted(per.items(), key=lambda x: -x[1][0]) if r[0] >= 0.5},
        }
    proc.send_signal(signal.SIGTERM)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.time() - start
    server.shutdown()

    latencies = []
    for t, body in ARRIVALS:
        for al in body.get("alerts", []):
            if al.get("status") == "firing":
                latencies.append((al["labels"].get("alertname"), al["labels"].get("gpu"),
                                  round((t - parse_ts(al["startsAt"])) * 1000)))
    cpu = ru.ru_utime + ru.ru_stime
    floor_out = {}
    if floor is not None:
        out, _ = floor.communicate(timeout=a.seconds + 60)
        f = json.loads(out.strip().splitlines()[-1])
        ticks = f["measured_ticks"] or 1
        floor_out = {
            "floor_cpu_percent_of_one_core": round(100 * f["cpu_s"] / ticks, 3),
            "floor_peak_rss_mib": round(f["peak_rss_kib"] / 1024, 1),
        }
    print(json.dumps({
        "scenario": a.scenario,
        "seconds": round(wall, 1),
        "exit": os.waitstatus_to_exitcode(status),
        "cpu_percent_of_one_core": round(100 * cpu / wall, 3),
        **steady,
        "peak_rss_mib": round(hwm_kib / 1024, 1),
        "ru_maxrss_mib_incl_fork": round(ru.ru_maxrss / 1024, 1),
        "last_rss_mib": round(rss_kib[-1] / 1024, 1) if rss_kib else None,
        "peak_private_rss_mib": round(max(anon_kib) / 1024, 1),
        "last_file_rss_mib": round(file_kib[-1] / 1024, 1),
        "speed": a.speed or 1,
        "simulated_hours": round(wall * (a.speed or 1) / 3600, 2),
        "scrapes": scrapes if a.exporter else None,
        "messages": len(ARRIVALS),
        "latency_ms": latencies,
        "log": log.name,
        **floor_out,
    }, indent=1))


if __name__ == "__main__":
    sys.exit(main())
