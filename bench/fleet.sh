#!/usr/bin/env bash
# A fleet on one machine: N gpuwatch daemons (8 simulated GPUs each, distinct host names; the
# last F of them lose a GPU at the same moment: XID 79), one Prometheus scraping them every 5 s,
# one Alertmanager they all push to (grouped by alertname) with a webhook receiver counting the
# notifications. Prints scrape duration per target, series count, the daemons' total RSS and CPU,
# and how many notifications Alertmanager sent for the fault. Not in CI (docs/fleet.md).
#
#   bash bench/fleet.sh [DAEMONS] [FAULTY] [SECONDS]     (default 50 10 90)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-50}"; F="${2:-10}"; SECS="${3:-90}"
command -v prometheus >/dev/null && command -v prometheus-alertmanager >/dev/null || {
    echo "needs Debian's prometheus and prometheus-alertmanager (bash .ci/run installs them)"; exit 1; }
cargo build --release -q -p gpuwatch -p nvml-sim
dir="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
used=" "
free_port() {   # a free port not handed out before in this run
    local p
    while :; do
        p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
        case "$used" in *" $p "*) ;; *) used="$used$p "; echo "$p"; return ;; esac
    done
}
ln -s "$PWD/target/release/libnvml_sim.so" "$dir/libnvidia-ml.so.1"

# The webhook receiver: counts Alertmanager's notifications by alertname and status.
hook=$(free_port); used="$used$hook "
python3 - "$hook" "$dir/hook.log" <<'PY' &
import http.server, json, sys
port, log = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        b = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(log, "a") as f:
            f.write(json.dumps({"status": b["status"], "alertname": b["groupLabels"].get("alertname"),
                                "alerts": len(b["alerts"])}) + "\n")
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
PY
pids+=($!)

am=$(free_port); used="$used$am "
cat > "$dir/am.yml" <<YML
route:
  receiver: hook
  group_by: [alertname]
  group_wait: 10s
  group_interval: 10s
  repeat_interval: 4h
receivers:
  - name: hook
    webhook_configs:
      - url: http://127.0.0.1:$hook/
YML
prometheus-alertmanager --config.file="$dir/am.yml" --storage.path="$dir/am" \
    --web.listen-address="127.0.0.1:$am" --cluster.listen-address= 2> "$dir/am.log" &
pids+=($!)

targets=()
daemon_pids=()
for i in $(seq 1 "$N"); do
    port=$(free_port); used="$used$port "
    host=$(printf "node-%03d" "$i")
    scenario=healthy; scale=1
    if [ "$i" -gt $((N - F)) ]; then scenario=xid-79; scale=1; fi
    mkdir -p "$dir/$host"
    cat > "$dir/$host/config.toml" <<TOML
[daemon]
interval = "1s"
state_dir = "$dir/$host/state"
rules = ["$PWD/rules"]
hostname = "$host"
[exporter]
listen = "127.0.0.1:$port"
[[channel]]
name = "am"
type = "alertmanager"
url = "http://127.0.0.1:$am"
[[route]]
channels = ["am"]
group_wait = "0s"
group_interval = "5s"
TOML
    NVML_SIM_SCENARIO=$scenario NVML_SIM_TIME_SCALE=$scale target/release/gpuwatch \
        --nvml-lib "$dir/libnvidia-ml.so.1" daemon --config "$dir/$host/config.toml" 2> "$dir/$host/log" &
    pids+=($!); daemon_pids+=($!)
    targets+=("\"127.0.0.1:$port\"")
done
prom=$(free_port); used="$used$prom "
cat > "$dir/prom.yml" <<YML
global:
  scrape_interval: 5s
scrape_configs:
  - job_name: gpuwatch
    static_configs:
      - targets: [$(IFS=,; echo "${targets[*]}")]
YML
prometheus --config.file="$dir/prom.yml" --storage.tsdb.path="$dir/tsdb" \
    --web.listen-address="127.0.0.1:$prom" 2> "$dir/prom.log" &
pids+=($!)
{ grep -l "cannot listen\|error" "$dir"/node-*/log 2>/dev/null || true; } | head -3 | while read -r f; do echo "$f:"; tail -3 "$f"; done
echo "$N daemons ($((N * 8)) GPUs, $F of them lose GPU 3 at 30 s), Prometheus and Alertmanager running; waiting ${SECS} s"
sleep "$SECS"

python3 - "$prom" "$dir/hook.log" "$N" "$SECS" "${daemon_pids[@]}" <<'PY'
import json, os, sys, urllib.parse, urllib.request
prom, hook, n, secs, pids = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), [int(p) for p in sys.argv[5:]]
def q(expr):
    u = f"http://127.0.0.1:{prom}/api/v1/query?query=" + urllib.parse.quote(expr)
    r = json.load(urllib.request.urlopen(u))["data"]["result"]
    return [float(x["value"][1]) for x in r]
tick = os.sysconf("SC_CLK_TCK")
rss = cpu = 0.0
for p in pids:
    try:
        for l in open(f"/proc/{p}/status"):
            if l.startswith("VmHWM:"):
                rss += int(l.split()[1]) / 1024
        f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        cpu += (int(f[11]) + int(f[12])) / tick
    except OSError:
        pass
up = q('sum(up{job="gpuwatch"})')
dur = q('avg(scrape_duration_seconds{job="gpuwatch"})'), q('max(max_over_time(scrape_duration_seconds{job="gpuwatch"}[1m]))')
series = q('sum(scrape_samples_scraped{job="gpuwatch"})')
head = q('count({job="gpuwatch"})')
gpus = q('count(gpuwatch_gpu_lost)')
print(f"targets up: {up[0]:.0f} of {n}; GPUs seen: {gpus[0]:.0f}")
print(f"scrape duration per target: mean {dur[0][0]*1000:.1f} ms, max {dur[1][0]*1000:.1f} ms (last minute)")
print(f"samples per scrape round: {series[0]:.0f} ({series[0]/n:.0f} per node); series in Prometheus: {head[0]:.0f}")
down = json.load(urllib.request.urlopen(f"http://127.0.0.1:{prom}/api/v1/query?query=" + urllib.parse.quote('up{job="gpuwatch"} == 0')))["data"]["result"]
for d in down:
    print("down:", d["metric"].get("instance"))
print(f"daemons: total peak RSS {rss:.0f} MiB ({rss/n:.1f} per daemon); CPU {cpu:.1f} s in ~{secs} s ({cpu/secs*100/n:.2f} % of a core per daemon, start-up included)")
notes = [json.loads(l) for l in open(hook)] if os.path.exists(hook) else []
by = {}
for x in notes:
    by.setdefault((x["alertname"], x["status"]), []).append(x["alerts"])
for (name, status), counts in sorted(by.items()):
    print(f"Alertmanager → receiver: {name} {status}: {len(counts)} notification(s), alerts per notification {counts}")
PY
