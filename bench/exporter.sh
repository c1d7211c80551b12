#!/usr/bin/env bash
# Exporter cost: a release `gpuwatch daemon` (8 simulated GPUs, `healthy`, 1 s interval, stock
# rules) with `[exporter]` on; after a warm-up, N scrapes of /metrics back to back, then the
# daemon's CPU time per scrape (from /proc/PID/stat, minus the same daemon's CPU over an equal
# idle stretch), the page size, and the daemon's peak RSS (VmHWM).
#
#   bash bench/exporter.sh [SCRAPES]      (default 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-2000}"
cargo build --release -q -p gpuwatch -p nvml-sim
dir="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$dir/config.toml" <<TOML
[daemon]
interval = "1s"
state_dir = "$dir/state"
rules = ["$PWD/rules"]
[exporter]
listen = "127.0.0.1:$port"
TOML
ln -s "$PWD/target/release/libnvml_sim.so" "$dir/libnvidia-ml.so.1"
NVML_SIM_SCENARIO=healthy target/release/gpuwatch --nvml-lib "$dir/libnvidia-ml.so.1" daemon --config "$dir/config.toml" 2> "$dir/log" &
pid=$!
sleep 5
python3 - "$pid" "$port" "$N" <<'PY'
import os, sys, time, http.client
pid, port, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tick = os.sysconf("SC_CLK_TCK")
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
def hwm():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmHWM:"):
            return int(l.split()[1]) / 1024
conn = http.client.HTTPConnection("127.0.0.1", port)
conn.request("GET", "/metrics"); body = conn.getresponse().read()
t0, c0 = time.monotonic(), cpu()
for _ in range(n):
    conn.request("GET", "/metrics"); conn.getresponse().read()
busy_s, busy_cpu = time.monotonic() - t0, cpu() - c0
c1 = cpu(); time.sleep(busy_s); idle_cpu = cpu() - c1
per = (busy_cpu - idle_cpu) / n
print(f"/metrics page: {len(body)} bytes, {body.count(b'DCGM_FI_DEV_GPU_UTIL{')} GPUs")
print(f"{n} scrapes in {busy_s:.2f} s: daemon CPU {busy_cpu:.2f} s (idle stretch {idle_cpu:.2f} s) = {per*1e6:.0f} us per scrape")
print(f"at one scrape per 15 s: {per/15*100:.4f} % of a core; daemon peak RSS {hwm():.1f} MiB")
print("targets: <= 1 ms CPU per scrape, <= 0.05 % of a core at 15 s, <= 20 MiB peak RSS")
PY
