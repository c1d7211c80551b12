#!/usr/bin/env bash
# `gpuwatch top` cost: a release build drawing 8 simulated GPUs (`overnight`, 1 s refresh, stock
# rules evaluated in the view: no daemon) in a 120×40 tmux pane for SECONDS, beside a release
# `gpuwatch record --interval 1s` of the same GPUs (the sampling alone) in another pane, both at
# once; prints each one's CPU (% of one core, from /proc/PID/stat) and peak RSS (VmHWM).
#
#   bash bench/top.sh [SECONDS]      (default 120)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-120}"
cargo build --release -q -p gpuwatch -p nvml-sim
dir="$(mktemp -d)"
sock="gpuwatch-bench-top-$$"
trap 'tmux -L "$sock" kill-server 2>/dev/null || true; rm -rf "$dir"' EXIT
cat > "$dir/config.toml" <<TOML
[daemon]
state_dir = "$dir/state"
rules = ["$PWD/rules"]
TOML
ln -s "$PWD/target/release/libnvml_sim.so" "$dir/libnvidia-ml.so.1"
exe="$PWD/target/release/gpuwatch"
common="env NVML_SIM_SCENARIO=overnight LANG=C.UTF-8 $exe --nvml-lib $dir/libnvidia-ml.so.1"
tmux -L "$sock" -f /dev/null new-session -d -x 120 -y 40 "$common top --config $dir/config.toml; sleep 600"
tmux -L "$sock" new-window -d "$common record --interval 1s --out $dir/rec.csv; sleep 600"
sleep 5
top_pid=$(pgrep -f -n "$exe --nvml-lib $dir/libnvidia-ml.so.1 top")
rec_pid=$(pgrep -f -n "$exe --nvml-lib $dir/libnvidia-ml.so.1 record")
python3 - "$top_pid" "$rec_pid" "$SECS" <<'PY'
import os, sys, time
tick = os.sysconf("SC_CLK_TCK")
pids, secs = [int(p) for p in sys.argv[1:3]], float(sys.argv[3])
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
def hwm(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmHWM:"):
            return int(l.split()[1]) / 1024
c0 = [cpu(p) for p in pids]; t0 = time.time()
time.sleep(secs)
c1 = [cpu(p) for p in pids]; t1 = time.time()
for name, p, a, b in zip(["top (8 GPUs, 1 s, rules, 120x40)", "record --interval 1s (sampling only)"], pids, c0, c1):
    print(f"{name}: {100 * (b - a) / (t1 - t0):.3f} % of a core over {t1 - t0:.0f} s, peak RSS {hwm(p):.1f} MiB")
PY
