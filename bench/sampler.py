"""Side-by-side benchmark driver (run by bench/sampler.sh).

Starts, at the same time, `gpuwatch record` (100 ms interval, CSV to /dev/null) and a Python
process running gpustat's own query loop (`gpustat.new_query()` every 100 ms), both against the
same simulated NVML library playing the `healthy` scenario (8 GPUs). CPU time (user + system) comes
from wait4() on each child, so each side is charged exactly its own process; peak RSS is each
child's VmHWM.
gpuwatch's figure includes its start-up; gpustat's excludes Python and module start-up (the loop
measures itself), which favours gpustat.
"""

import argparse
import json
import os
import sys
import tempfile
import time

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
    if due - t0 >= seconds:
        break
    if due > now:
        time.sleep(due - now)
    gpustat.new_query()
    ticks += 1
print(json.dumps({"ticks": ticks, "cpu_s": cpu() - c0, "gpus": gpus}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--scenario", default="healthy")
    ap.add_argument("--gpuwatch", required=True)
    ap.add_argument("--sim-lib", required=True)
    a = ap.parse_args()

    libdir = tempfile.mkdtemp(prefix="gpuwatch-bench-")
    os.symlink(os.path.abspath(a.sim_lib), os.path.join(libdir, "libnvidia-ml.so.1"))
    env = dict(os.environ, NVML_SIM_SCENARIO=a.scenario, LD_LIBRARY_PATH=libdir)
    for k in ("NVML_SIM_TIME_SCALE", "NVML_SIM_CONTROL", "GPUWATCH_NVML_LIB"):
        env.pop(k, None)

    interval_ms = int(round(a.interval * 1000))
    gw_cmd = [os.path.abspath(a.gpuwatch), "--nvml-lib", os.path.join(libdir, "libnvidia-ml.so.1"), "record",
              "--interval", f"{interval_ms}ms", "--duration", f"{a.seconds}s"]
    outdir = tempfile.mkdtemp(prefix="gpuwatch-bench-out-")
    paths = {k: os.path.join(outdir, k) for k in ("gw.err", "gs.out", "gs.err")}

    def spawn(argv, stdout, stderr):
        actions = [(os.POSIX_SPAWN_OPEN, 1, stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
                   (os.POSIX_SPAWN_OPEN, 2, stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
        return os.posix_spawn(argv[0], argv, env, file_actions=actions)

    # gpuwatch's process startup (dlopen, nvmlInit, device discovery) is measured on its own with
    # a one-tick run and subtracted, so both sides count steady-state CPU per sample (the gpustat
    # loop below measures inside an already-started Python process, after its imports).
    one_tick = spawn(gw_cmd[:-1] + [f"{interval_ms}ms"], os.devnull, paths["gw.err"])
    _, status, ru = os.wait4(one_tick, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"gpuwatch one-tick run failed: {open(paths['gw.err']).read()}")
    startup_cpu = ru.ru_utime + ru.ru_stime

    gw = spawn(gw_cmd, os.devnull, paths["gw.err"])
    gs = spawn([sys.executable, "-c", GPUSTAT_LOOP, str(a.seconds), str(a.interval)],
               paths["gs.out"], paths["gs.err"])
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
        pid, status, ru = os.wait4(-1, os.WNOHANG)
        if pid:
            results[pid] = (os.waitstatus_to_exitcode(status), ru)
        else:
            time.sleep(0.05)
    (gw_rc, gw_ru), (gs_rc, gs_ru) = results[gw], results[gs]
    read = lambda k: open(paths[k]).read()
    if gw_rc != 0 or gs_rc != 0:
        sys.exit(f"benchmark run failed:\ngpuwatch: {read('gw.err')}\ngpustat: {read('gs.err')}")
    g = json.loads(read("gs.out"))
    for f in paths.values():
        os.unlink(f)
    os.rmdir(outdir)
    gw_ticks = int(a.seconds / a.interval)
    gw_cpu = gw_ru.ru_utime + gw_ru.ru_stime
    gw_whole = gw_cpu / gw_ticks
    gw_per = max(gw_cpu - startup_cpu, 1e-9) / max(gw_ticks - 1, 1)
    gs_per = g["cpu_s"] / g["ticks"]
    print(f"scenario {a.scenario}: {g['gpus']} simulated GPUs, interval {interval_ms} ms, {a.seconds:g} s side by side")
    print(f"gpuwatch record : {gw_ticks:5d} ticks  CPU {gw_cpu:8.3f} s  = {gw_whole * 1e6:9.1f} us/tick"
          f" whole process, {gw_per * 1e6:9.1f} us/tick after startup ({startup_cpu * 1e3:.1f} ms)"
          f"  peak RSS {hwm[gw] / 1024:6.1f} MiB")
    print(f"gpustat loop    : {g['ticks']:5d} ticks  CPU {g['cpu_s']:8.3f} s  = {gs_per * 1e6:9.1f} us/tick"
          f"  peak RSS {hwm[gs] / 1024:6.1f} MiB")
    print(f"ratio           : gpustat uses {gs_per / gw_per:.0f}x the CPU per sample of gpuwatch"
          f" in steady state ({gs_per / gw_whole:.0f}x counting gpuwatch's startup too)"
          f" (target >= 50x); gpuwatch RSS target < 20 MiB")
    os.unlink(os.path.join(libdir, "libnvidia-ml.so.1"))
    os.rmdir(libdir)


if __name__ == "__main__":
    main()
