"""Side-by-side benchmark driver (run by bench/sampler.sh).

For each interval (100 ms, then 1 s) starts, at the same time and against the same simulated NVML
library playing the `healthy` scenario (8 GPUs) with nvml-sim's default call costs (measured on an
H200: getters ~1 us, the energy counter 3 ms of CPU, PCIe byte counters 0.13 ms, process lists
3 ms of waiting; the GPM sample 200 us, an estimate until measured on a Hopper GPU), or — without
`--sim-lib` — the system's real driver:

* `gpuwatch record --stats` (CSV to /dev/null),
* `gpuwatch daemon` (every stock rule, the exporter on a loopback port, no channels),
* the floor (`bench/floor.rs`): the sampler's NVML calls at its cadences on one thread, nothing
  else — what the calls cost by themselves,
* with `--peers`, gpustat's own query loop (`gpustat.new_query()`) and nvitop's
  (`Device.as_snapshot()` and `processes()` per GPU) at the same interval, for context.

gpuwatch's and the floor's steady-state CPU is the CPU time of all their threads (the kernel's
per-thread schedstat, in ns) over a window of SECONDS (default 60) that starts WARM_S (3 s) after
they started: start-up (dlopen, nvmlInit, the first read of every counter) is outside it, and a
60 s window holds each slow cadence at its own rate (the PCIe byte counters twice, the replay
counter once, the process lists twelve times; the energy counter is read hourly, so a window of
an hour holds one read: 8 x 3 ms an hour). The peers measure themselves after their imports and a
warm-up query, which favours them. The headline is CPU per device-sample over the floor's.
With `--no-gpm` gpuwatch and the floor run without GPM (the GPM sample's estimated cost dominates
the floor with it). nvml-sim's call counts (NVML_SIM_CALL_COUNTS) show whether gpuwatch and the
floor made the same calls (counting is lock-free and the same for both). Peak RSS is each child's
VmHWM; the floor also reports its RSS right after nvmlInit (the library's own floor).
"""

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

WARM_S = 3.0

GPUSTAT_LOOP = r"""
import json, resource, sys, time
import gpustat
seconds, interval = float(sys.argv[1]), float(sys.argv[2])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
gpus = len(gpustat.new_query().gpus)            # warm-up (imports, first init)
c0, t0, ticks = cpu(), time.monotonic(), 0
while True:
    due = t0 + ticks * interval
    now = time.monotonic()
    if due - t0 >= seconds or now - t0 >= seconds:   # gpustat sleeps 0.1 s per GPU with processes
        break
    if due > now:
        time.sleep(due - now)
    gpustat.new_query()
    ticks += 1
print(json.dumps({"ticks": ticks, "cpu_s": cpu() - c0, "gpus": gpus}))
"""


def threads_cpu_ns(pid):
    """CPU time of every thread of `pid` so far (ns, /proc/PID/task/*/schedstat), and the thread
    ids (a thread that ends takes its time with it: the window's threads must stay the same)."""
    total, tids = 0, set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
            tids.add(tid)
    except OSError:
        return None
    return total, tids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60, help="the measured window")
    ap.add_argument("--intervals", default="0.1,1")
    ap.add_argument("--scenario", default="healthy")
    ap.add_argument("--gpuwatch", required=True)
    ap.add_argument("--sim-lib", help="nvml-sim's library; without it both sides use the real driver")
    ap.add_argument("--floor", help="bench/floor.rs's binary (the floor)")
    ap.add_argument("--no-gpm", action="store_true",
                    help="gpuwatch and the floor without GPM (the GPM sample's cost, an estimate until "
                         "measured on a Hopper GPU, dominates the floor with it)")
    ap.add_argument("--gpm-interval", default="1s",
                    help="the GPM cadence of record, daemon and floor alike (record's default; the "
                         "daemon's own default is 10s)")
    ap.add_argument("--peers", action="store_true", help="also run gpustat's and nvitop's loops (context)")
    ap.add_argument("--gpm", action="store_true",
                    help="instead of gpustat, run `gpuwatch --no-gpm record` beside `gpuwatch record` "
                         "(GPM read at every tick on Hopper GPUs): what GPM costs, in one run")
    a = ap.parse_args()
    if a.seconds <= 0:
        sys.exit("--seconds must be positive")
    if a.sim_lib:
        lat = os.environ.get("NVML_SIM_LATENCY")
        print(f"nvml-sim latencies: {'defaults (realistic)' if lat is None else 'NVML_SIM_LATENCY=' + lat}")
    else:
        print("the real NVIDIA driver (the system's libnvidia-ml.so.1)")
    for interval in a.intervals.split(","):
        a.interval = float(interval)
        if a.gpm:
            run_gpm(a)
        else:
            run(a)


STATS = re.compile(r"(\d+) ticks taken, (\d+) skipped \(([\d.]+) % kept\); sample wall time median ([\d.]+) ms, "
                   r"p99 ([\d.]+) ms, max ([\d.]+) ms(?:; (\d+) GPUs)?")


def watch(pids, seconds, stop=None):
    """Follows the children `pids` ({name: pid}) until each has exited: their peak RSS (VmHWM,
    polled), their threads' CPU at the start and the end of the measured window (WARM_S after
    the start, `seconds` long) and their exit codes. `stop` = (name, after_s): that child (one
    that runs until told) gets SIGTERM `after_s` seconds after the start."""
    started = time.monotonic()
    window = {n: [] for n in pids}
    hwm = {n: 0 for n in pids}
    done = {}
    stopped = False
    while len(done) < len(pids):
        since = time.monotonic() - started
        for n, pid in pids.items():
            if n in done:
                continue
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            hwm[n] = max(hwm[n], int(line.split()[1]))
            except OSError:
                pass
            w = window[n]
            if len(w) < 2 and since >= WARM_S + len(w) * seconds:
                cpu = threads_cpu_ns(pid)
                if cpu is not None:
                    w.append((time.monotonic(), *cpu))
        if stop and not stopped and since >= stop[1] and stop[0] not in done:
            os.kill(pids[stop[0]], signal.SIGTERM)
            stopped = True
        pid, status, _ = os.wait4(-1, os.WNOHANG)
        if pid:
            name = next(n for n, p in pids.items() if p == pid)
            done[name] = os.waitstatus_to_exitcode(status)
        else:
            time.sleep(0.01)
    return window, hwm, done


def run_gpm(a):
    """`gpuwatch record --stats` with GPM (every tick on GPUs that have it) and with `--no-gpm`,
    side by side against the same library: ticks kept, sample wall time, CPU per device-sample in
    the same window, peak RSS."""
    env = dict(os.environ)
    for k in ("NVML_SIM_TIME_SCALE", "NVML_SIM_CONTROL", "GPUWATCH_NVML_LIB"):
        env.pop(k, None)
    lib_args = []
    if a.sim_lib:
        env.update(NVML_SIM_SCENARIO=a.scenario)
        lib_args = ["--nvml-lib", os.path.abspath(a.sim_lib)]
    interval_ms = int(round(a.interval * 1000))
    run_s = WARM_S + a.seconds + 2.0
    base = [os.path.abspath(a.gpuwatch), *lib_args]
    rec = ["record", "--interval", f"{interval_ms}ms", "--gpm-interval", "0s", "--duration", f"{run_s}s",
           "--stats"]
    outdir = tempfile.mkdtemp(prefix="gpuwatch-bench-gpm-")
    sides = {"GPM on ": base + rec, "--no-gpm": base + ["--no-gpm"] + rec}
    pids, errs = {}, {}
    for name, argv in sides.items():
        errs[name] = os.path.join(outdir, name.strip().replace("-", "") + ".err")
        actions = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                   (os.POSIX_SPAWN_OPEN, 2, errs[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
        pids[name] = os.posix_spawn(argv[0], argv, env, file_actions=actions)
    window, hwm, done = watch(pids, a.seconds)
    where = f"scenario {a.scenario}" if a.sim_lib else "the real driver"
    print(f"{where}, interval {interval_ms} ms, {run_s:g} s side by side, CPU measured over {a.seconds:g} s")
    for n in pids:
        text = open(errs[n]).read()
        os.unlink(errs[n])
        m = STATS.search(text)
        if done[n] != 0 or not m or len(window[n]) < 2:
            sys.exit(f"{n}: run failed (exit {done[n]}):\n{text}")
        gpus = int(m[7] or 1)
        kept = float(m[3])
        (w0, c0, _), (w1, c1, _) = window[n]
        per = max(c1 - c0, 1) / 1e9 / ((w1 - w0) / a.interval * max(kept, 1.0) / 100.0)
        print(f"gpuwatch record {n}: {int(m[1]):5d} ticks ({kept:.1f} % kept, {m[2]} skipped)  sample wall time"
              f" median {m[4]} ms, p99 {m[5]} ms, max {m[6]} ms  CPU {(c1 - c0) / 1e9:.3f} s in {w1 - w0:.1f} s"
              f" = {per * 1e6 / gpus:.1f} us per device-sample ({gpus} GPUs)  peak RSS {hwm[n] / 1024:.1f} MiB")
    os.rmdir(outdir)


NVITOP_LOOP = r"""
import json, resource, sys, time
from nvitop import Device
seconds, interval = float(sys.argv[1]), float(sys.argv[2])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
devices = Device.all()
def query():
    for d in devices:
        d.as_snapshot()
        d.processes()
query()                                          # warm-up (imports, first reads)
c0, t0, ticks = cpu(), time.monotonic(), 0
while True:
    due = t0 + ticks * interval
    now = time.monotonic()
    if due - t0 >= seconds or now - t0 >= seconds:
        break
    if due > now:
        time.sleep(due - now)
    query()
    ticks += 1
print(json.dumps({"ticks": ticks, "cpu_s": cpu() - c0, "gpus": len(devices)}))
"""


def read_counts(path):
    """nvml-sim's call counts (NVML_SIM_CALL_COUNTS): {symbol: count}; None without the file."""
    if not os.path.exists(path):
        return None
    counts = {}
    try:
        with open(path) as f:
            for line in f:
                k, v = line.rsplit(" ", 1)
                counts[k] = int(v)
    except OSError:
        pass
    return counts


# Made once per GPU (or once) at start-up, or at exit: not part of the steady state.
START_ONLY = ("nvmlInit", "nvmlShutdown", "nvmlSystemGet", "nvmlDeviceGetCount", "nvmlDeviceGetHandle",
              "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo", "nvmlDeviceGetMinorNumber",
              "nvmlDeviceGetIndex", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents",
              "nvmlEventSetCreate", "nvmlEventSetFree", "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc",
              "nvmlGpmSampleFree", "nvmlDeviceGetNvLinkVersion", "nvmlDeviceGetNvLinkRemotePciInfo",
              "nvmlErrorString", "nvmlDeviceGetHandleByPciBusId",
              "nvmlDeviceGetNvLinkRemoteDeviceType")


def compare_counts(name, mine, floor, rounds):
    """The calls `name` made that the floor did not (or fewer), beyond a tick's and a slow
    round's worth (the two may start and end a round apart)."""
    if mine is None or floor is None:
        print(f"  no call counts from {name if mine is None else 'the floor'} (did it exit cleanly?)")
        return
    out = []
    for k in sorted(set(mine) | set(floor)):
        if k.startswith(START_ONLY):
            continue
        a, b = mine.get(k, 0), floor.get(k, 0)
        if abs(a - b) > max(16, 1.5 * max(a, b) / max(rounds, 1)):
            out.append(f"{k}: {a} vs floor {b}")
    if out:
        print(f"  calls that differ ({name} vs floor): " + "; ".join(out))
    else:
        print(f"  {name} and the floor made the same NVML calls (nvml-sim's counts, within a slow round)")


def run(a):
    """One interval: gpuwatch record, gpuwatch daemon, the floor, gpustat's loop and nvitop's,
    started together against the same library and measured over the same window."""
    env = dict(os.environ)
    for k in ("NVML_SIM_TIME_SCALE", "NVML_SIM_CONTROL", "GPUWATCH_NVML_LIB", "NVML_SIM_CALL_COUNTS"):
        env.pop(k, None)
    libdir, lib_args = None, []
    if a.sim_lib:
        libdir = tempfile.mkdtemp(prefix="gpuwatch-bench-")
        os.symlink(os.path.abspath(a.sim_lib), os.path.join(libdir, "libnvidia-ml.so.1"))
        env.update(NVML_SIM_SCENARIO=a.scenario, LD_LIBRARY_PATH=libdir)
        lib_args = ["--nvml-lib", os.path.join(libdir, "libnvidia-ml.so.1")]
    interval_ms = int(round(a.interval * 1000))
    run_s = WARM_S + a.seconds + 2.0
    outdir = tempfile.mkdtemp(prefix="gpuwatch-bench-out-")
    config = os.path.join(outdir, "config.toml")
    with open(config, "w") as f:
        f.write(f"""
[daemon]
interval = "{interval_ms}ms"
gpm_interval = "{a.gpm_interval}"
state_dir = "{outdir}/state"
rules = ["{os.path.abspath('rules')}"]

[exporter]
listen = "127.0.0.1:0"
""")
    gw = os.path.abspath(a.gpuwatch)
    no_gpm = ["--no-gpm"] if a.no_gpm else []
    sides = {
        "gpuwatch record": [gw, *lib_args, *no_gpm, "record", "--interval", f"{interval_ms}ms",
                            "--gpm-interval", a.gpm_interval,
                            "--duration", f"{run_s}s", "--stats"],
        "gpuwatch daemon": [gw, *lib_args, *no_gpm, "daemon", "--config", config],
        "floor": [os.path.abspath(a.floor), *lib_args, *no_gpm, "--interval", f"{interval_ms}ms",
                  "--gpm-interval", a.gpm_interval,
                  "--duration", f"{run_s}s", "--warm", f"{WARM_S}s"],
    }
    if a.peers:
        sides["gpustat loop"] = [sys.executable, "-c", GPUSTAT_LOOP, str(run_s), str(a.interval)]
        sides["nvitop loop"] = [sys.executable, "-c", NVITOP_LOOP, str(run_s), str(a.interval)]
    pids, paths = {}, {}
    for name, argv in sides.items():
        key = name.replace(" ", "-")
        paths[name] = {k: os.path.join(outdir, f"{key}.{k}") for k in ("out", "err", "counts")}
        e = dict(env)
        if a.sim_lib and not name.endswith("loop"):
            e["NVML_SIM_CALL_COUNTS"] = paths[name]["counts"]
        actions = [(os.POSIX_SPAWN_OPEN, 1, paths[name]["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
                   (os.POSIX_SPAWN_OPEN, 2, paths[name]["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
        pids[name] = os.posix_spawn(argv[0], argv, e, file_actions=actions)
    window, hwm, done = watch(pids, a.seconds, stop=("gpuwatch daemon", run_s))
    read = lambda n, k: open(paths[n][k]).read() if os.path.exists(paths[n][k]) else ""
    for n, rc in done.items():
        if rc != 0:
            sys.exit(f"{n} failed (exit {rc}):\n{read(n, 'err')[-3000:]}")
    where = f"scenario {a.scenario}, simulated GPUs" if a.sim_lib else "the real driver"
    print(f"\n{where}, interval {interval_ms} ms, GPM {'off (--no-gpm)' if a.no_gpm else 'every ' + a.gpm_interval}, {run_s:g} s side by side, CPU measured over the same {a.seconds:g} s")
    m = STATS.search(read("gpuwatch record", "err"))
    if not m:
        sys.exit(f"no --stats line from gpuwatch record:\n{read('gpuwatch record', 'err')[-3000:]}")
    kept = float(m[3])
    floor_json = json.loads(read("floor", "out").strip().splitlines()[-1])
    gpus = floor_json["gpus"]

    def per_sample_us(n, kept_pct=100.0):
        (w0, c0, t0), (w1, c1, t1) = window[n]
        if t0 != t1:
            print(f"  warning: {n}'s threads changed in the window ({sorted(t0 ^ t1)}): "
                  "a thread that ended takes its CPU with it", file=sys.stderr)
        ticks = (w1 - w0) / a.interval * max(kept_pct, 1.0) / 100.0
        return max(c1 - c0, 1) / 1e3 / ticks / gpus, (c1 - c0) / 1e9, w1 - w0

    for n in pids:
        if not n.endswith("loop") and len(window[n]) < 2:
            sys.exit(f"{n} ended before the measured window did")
    floor_us, floor_cpu, span = per_sample_us("floor")
    rows = []
    rec_us, rec_cpu, _ = per_sample_us("gpuwatch record", kept)
    rows.append(("gpuwatch record", rec_us, rec_cpu, f"{int(m[1])} ticks, {kept:.1f} % kept, sample wall median {m[4]} ms, p99 {m[5]} ms"))
    dmn_us, dmn_cpu, _ = per_sample_us("gpuwatch daemon")
    rows.append(("gpuwatch daemon", dmn_us, dmn_cpu, f"{100 * dmn_cpu / span:.3f} % of a core (every stock rule, exporter on)"))
    rows.append(("floor", floor_us, floor_cpu, f"{100 * floor_cpu / span:.3f} % of a core; RSS after nvmlInit {floor_json['init_rss_kib'] / 1024:.1f} MiB"))
    for n in ("gpustat loop", "nvitop loop"):
        if n in pids:
            g = json.loads(read(n, "out").strip().splitlines()[-1])
            rows.append((n, g["cpu_s"] / max(g["ticks"], 1) / max(g["gpus"], 1) * 1e6, g["cpu_s"],
                         f"{g['ticks']} ticks (measures itself after its warm-up)"))
    for n, us, cpu, note in rows:
        ratio = us / floor_us if floor_us > 0 else float("nan")
        print(f"  {n:16s} {us:9.1f} us per device-sample  {ratio:6.2f}x the floor  CPU {cpu:7.3f} s"
              f"  peak RSS {hwm[n] / 1024:6.1f} MiB  ({note})")
    print(f"  headline: gpuwatch record / floor = {rec_us / floor_us:.2f} (target <= 1.3), "
          f"daemon / floor = {dmn_us / floor_us:.2f}")
    if a.sim_lib:
        floor_counts = read_counts(paths["floor"]["counts"])
        for n in ("gpuwatch record", "gpuwatch daemon"):
            # slow rounds in the run, at the default 5 s process interval
            compare_counts(n, read_counts(paths[n]["counts"]), floor_counts, run_s / 5.0)
    for n in paths:
        for p in paths[n].values():
            if os.path.exists(p):
                os.unlink(p)
    shutil.rmtree(outdir, ignore_errors=True)
    if libdir:
        shutil.rmtree(libdir, ignore_errors=True)


if __name__ == "__main__":
    main()
