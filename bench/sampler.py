"""Side-by-side benchmark driver (run by bench/sampler.sh).

For each interval (100 ms, then 1 s) starts, at the same time, `gpuwatch record --stats` (CSV to
/dev/null) and a Python process running gpustat's own query loop (`gpustat.new_query()` at the
same interval), both against the same simulated NVML library playing the `healthy` scenario
(8 GPUs) with nvml-sim's default call costs (measured on an H200: getters ~1 us, the energy
counter 3 ms of CPU, PCIe throughput 20 ms, init 10 ms; process lists 3 ms), or — without
`--sim-lib` — against the system's real driver (bench/real-gpu.sh does that on a GPU machine).
gpuwatch's steady-state CPU is the CPU time of all its threads (the kernel's per-thread
schedstat, in ns) over a window of SECONDS (default 60) that starts WARM_S (3 s) after it
started: start-up (dlopen, nvmlInit, the first read of every counter) is outside it, and a 60 s
window holds each slow cadence at its own rate (the energy counter once, the PCIe counters
twice, the process lists twelve times). Its whole-run CPU (wait4, start-up included) is printed
too. gpustat's loop runs for the same time and measures itself after its imports and a warm-up
query, which favours gpustat; it keeps fewer ticks than asked on several GPUs because
`new_query()` sleeps 0.1 s per GPU that has processes (its CPU per query is what is compared).
Peak RSS is each child's VmHWM. gpuwatch's ticks kept and sample wall times come from its
--stats line; its CPU per tick counts the ticks due in the window less the share it skipped.
"""

import argparse
import json
import os
import re
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
    rec = ["record", "--interval", f"{interval_ms}ms", "--duration", f"{run_s}s", "--stats"]
    outdir = tempfile.mkdtemp(prefix="gpuwatch-bench-gpm-")
    sides = {"GPM on ": base + rec, "--no-gpm": base + ["--no-gpm"] + rec}
    pids, errs = {}, {}
    for name, argv in sides.items():
        errs[name] = os.path.join(outdir, name.strip().replace("-", "") + ".err")
        actions = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                   (os.POSIX_SPAWN_OPEN, 2, errs[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
        pids[name] = os.posix_spawn(argv[0], argv, env, file_actions=actions)
    started = time.monotonic()
    window = {n: [] for n in pids}
    hwm = {n: 0 for n in pids}
    done = {}
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
            if len(w) < 2 and since >= WARM_S + len(w) * a.seconds:
                cpu = threads_cpu_ns(pid)
                if cpu is not None:
                    w.append((time.monotonic(), *cpu))
        pid, status, _ = os.wait4(-1, os.WNOHANG)
        if pid:
            name = next(n for n, p in pids.items() if p == pid)
            done[name] = os.waitstatus_to_exitcode(status)
        else:
            time.sleep(0.01)
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


def run(a):

    env = dict(os.environ)
    for k in ("NVML_SIM_TIME_SCALE", "NVML_SIM_CONTROL", "GPUWATCH_NVML_LIB"):
        env.pop(k, None)
    libdir, lib_args = None, []
    if a.sim_lib:
        libdir = tempfile.mkdtemp(prefix="gpuwatch-bench-")
        os.symlink(os.path.abspath(a.sim_lib), os.path.join(libdir, "libnvidia-ml.so.1"))
        env.update(NVML_SIM_SCENARIO=a.scenario, LD_LIBRARY_PATH=libdir)
        lib_args = ["--nvml-lib", os.path.join(libdir, "libnvidia-ml.so.1")]

    interval_ms = int(round(a.interval * 1000))
    run_s = WARM_S + a.seconds + 2.0
    gw_cmd = [os.path.abspath(a.gpuwatch), *lib_args, "record",
              "--interval", f"{interval_ms}ms", "--duration", f"{run_s}s", "--stats"]
    outdir = tempfile.mkdtemp(prefix="gpuwatch-bench-out-")
    paths = {k: os.path.join(outdir, k) for k in ("gw.err", "gs.out", "gs.err")}

    def spawn(argv, stdout, stderr):
        actions = [(os.POSIX_SPAWN_OPEN, 1, stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
                   (os.POSIX_SPAWN_OPEN, 2, stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
        return os.posix_spawn(argv[0], argv, env, file_actions=actions)

    gw = spawn(gw_cmd, os.devnull, paths["gw.err"])
    gs = spawn([sys.executable, "-c", GPUSTAT_LOOP, str(run_s), str(a.interval)],
               paths["gs.out"], paths["gs.err"])
    started = time.monotonic()
    window = []  # (monotonic time, gpuwatch's CPU ns, its thread ids) at the window's start and end
    # Peak RSS: VmHWM of each child's own address space (ru_maxrss would also count the
    # spawning Python process's pages from before exec), polled until the child exits.
    hwm = {gw: 0, gs: 0}
    results = {}
    while len(results) < 2:
        for pid in hwm:
            if pid in results:
                continue
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            hwm[pid] = max(hwm[pid], int(line.split()[1]))
            except OSError:
                pass
        since = time.monotonic() - started
        if len(window) < 2 and since >= WARM_S + len(window) * a.seconds and gw not in results:
            cpu = threads_cpu_ns(gw)
            if cpu is not None:
                window.append((time.monotonic(), *cpu))
        pid, status, ru = os.wait4(-1, os.WNOHANG)
        if pid:
            results[pid] = (os.waitstatus_to_exitcode(status), ru)
        else:
            time.sleep(0.01 if len(window) < 2 else 0.05)
    (gw_rc, gw_ru), (gs_rc, gs_ru) = results[gw], results[gs]
    read = lambda k: open(paths[k]).read()
    if gw_rc != 0 or gs_rc != 0:
        sys.exit(f"benchmark run failed:\ngpuwatch: {read('gw.err')}\ngpustat: {read('gs.err')}")
    g = json.loads(read("gs.out"))
    stats = [l for l in read("gw.err").splitlines() if l.startswith("gpuwatch record:")]
    for f in paths.values():
        os.unlink(f)
    os.rmdir(outdir)
    m = re.search(r"(\d+) ticks taken, (\d+) skipped \(([\d.]+) % kept\); sample wall time median ([\d.]+) ms, "
                  r"p99 ([\d.]+) ms, max ([\d.]+) ms", stats[0] if stats else "")
    if not m:
        sys.exit(f"no --stats line from gpuwatch: {stats}")
    gw_ticks, skipped, kept = int(m[1]), int(m[2]), float(m[3])
    gpus = g["gpus"]
    if len(window) < 2:
        sys.exit("gpuwatch ended before the measured window did")
    gw_cpu = gw_ru.ru_utime + gw_ru.ru_stime
    gw_whole = gw_cpu / gw_ticks
    (w0, c0, t0), (w1, c1, t1) = window
    if t0 != t1:
        print(f"warning: gpuwatch's threads changed in the window ({sorted(t0 ^ t1)}): the CPU of a "
              "thread that ended is not counted", file=sys.stderr)
    # ticks in the window: those due, less the share the run skipped
    gw_per = max(c1 - c0, 1) / 1e9 / ((w1 - w0) / a.interval * max(kept, 1.0) / 100.0)
    gs_per = g["cpu_s"] / g["ticks"]
    gs_due = int(run_s / a.interval)
    where = f"scenario {a.scenario}: {gpus} simulated GPUs" if a.sim_lib else f"real driver: {gpus} GPU(s)"
    print(f"{where}, interval {interval_ms} ms, {run_s:g} s side by side, CPU measured over {a.seconds:g} s")
    print(f"gpuwatch record : {gw_ticks:5d} ticks ({kept:.1f} % of the schedule kept, {skipped} skipped)"
          f"  sample wall time median {m[4]} ms, p99 {m[5]} ms, max {m[6]} ms")
    print(f"                  CPU {(c1 - c0) / 1e9:8.3f} s in the {w1 - w0:.1f} s window = {gw_per * 1e6 / gpus:8.1f} us per device-sample"
          f" ({gw_whole * 1e6 / gpus:.1f} over the whole run, start-up included: {gw_cpu:.3f} s)"
          f"  peak RSS {hwm[gw] / 1024:6.1f} MiB")
    print(f"gpustat loop    : {g['ticks']:5d} ticks ({100.0 * g['ticks'] / max(gs_due, 1):.1f} % of {gs_due})"
          f"  CPU {g['cpu_s']:8.3f} s = {gs_per * 1e6 / gpus:8.1f} us per device-sample  peak RSS {hwm[gs] / 1024:6.1f} MiB")
    print(f"ratio           : gpustat uses {gs_per / gw_per:.0f}x the CPU per device-sample of gpuwatch"
          f" in steady state ({gs_per / gw_whole:.0f}x counting gpuwatch's startup too)"
          f" (target >= 100x); gpuwatch keeps >= 95 % of its ticks; RSS target < 20 MiB")
    if libdir:
        os.unlink(os.path.join(libdir, "libnvidia-ml.so.1"))
        os.rmdir(libdir)


if __name__ == "__main__":
    main()
