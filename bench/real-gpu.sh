#!/usr/bin/env bash
# gpuwatch on a real NVIDIA GPU: the day a machine with the driver is at hand, run
#
#   bash bench/real-gpu.sh            # on the GPU machine (builds gpuwatch --release)
#   bash bench/real-gpu.sh --sim      # anywhere: every step against nvml-sim (CI runs this)
#
# Steps:
#   1. build gpuwatch, nvml-sim and examples/nvml_latency (release; skipped when GPUWATCH_BIN,
#      NVML_SIM_LIB (with --sim) and NVML_LATENCY_BIN are given);
#   2. `gpuwatch devices`, `status --json`, `doctor` (findings are reported, not fatal);
#   3. a `gpuwatch record` of REAL_GPU_RECORD_S seconds (60; 5 with --sim) at 1 s beside
#      `nvidia-smi --query-gpu=<fields> --format=csv -lms 1000`, then every common field
#      compared per GPU, median against median over the run (the two tools sample at different
#      instants, so instantaneous values cannot be compared). Tolerances:
#        temperature.gpu          ±2 °C
#        power.draw               ±10 % (NVML's power is a 1 s average; the windows differ)
#        enforced.power.limit     ±1 %
#        memory.used / .total     ±1 %  (gpuwatch bytes → MiB)
#        utilization.gpu/.memory  ±15 points (a sampling-period average, read at other instants)
#        clocks.sm / clocks.mem   ±10 %
#        fan.speed                ±5 points
#        pstate                   equal (P0 … P15)
#        ecc.errors.*.volatile    equal
#      With --sim there is no nvidia-smi: the same comparison runs on the repository's paired
#      fixtures (tests/fixtures/traces/healthy.{gpuwatch,smi}.csv, and strictly on the minute a
#      real H200 gave both tools, tests/fixtures/real/idle-minute.*) so the code cannot rot;
#   4. the wall time of every NVML call gpuwatch makes, min/median/max over 50 calls on GPU 0
#      (examples/nvml_latency.rs), GPM's included (nvmlGpmSampleGet, nvmlGpmMetricsGet: nvml-sim's
#      costs for them are estimates until this runs on a Hopper GPU) and what GPM reads over a
#      second — replace the estimates in ../shared/docs/real-drivers.md and nvml-sim's table;
#   5. if PyTorch with CUDA is importable: a 2-minute recording of a small training loop with a
#      deliberately slow DataLoader into tests/fixtures/real/, with the GPU and driver beside it in
#      dataloader-stall.txt (a README.md is created when there is none); then, on a GPU with GPM
#      (Hopper and later), 15 s each of a tiny-kernel loop, a bf16 GEMM loop and a device-to-device
#      copy loop under `gpuwatch record` and the medians of util, sm_active, tensor_active and
#      dram_active per loop (expected: ~100 % util with low SM active, high tensor active, high
#      DRAM active) into $OUT/gpm-loads.txt;
#   6. (real driver only) bench/sampler.py without a simulator: `gpuwatch record --stats` and
#      `gpuwatch daemon` beside the floor (bench/floor.rs: the sampler's NVML calls alone, on this
#      driver) and, when importable, gpustat's and nvitop's query loops, at 100 ms and 1 s, with
#      GPM and with --no-gpm; CPU over a window of REAL_GPU_BENCH_S seconds each (60: every slow
#      cadence at its own rate): gpuwatch's ratio to the floor on real hardware; and
#      bench/daemon.py: `gpuwatch daemon` with every stock
#      rule for REAL_GPU_DAEMON_S seconds (60), its CPU and peak RSS.
#
# Outputs go to REAL_GPU_OUT (default: a new temporary directory); with --sim nothing is written
# into the repository. Without a driver and without --sim the script says so in one line and
# exits 0. Exit 1 when a step fails or (on a real GPU) a field is out of tolerance.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SIM=0
for a in "$@"; do
    case "$a" in
        --sim) SIM=1 ;;
        -h|--help) sed -n '2,/^set -uo/{/^set -uo/!p}' "$0"; exit 0 ;;
        *) echo "real-gpu.sh: unknown argument $a (use --sim or nothing)" >&2; exit 2 ;;
    esac
done

has_driver() {
    [ -e /proc/driver/nvidia/version ] && return 0
    command -v ldconfig >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1' && return 0
    return 1
}

if [ "$SIM" = 0 ] && ! has_driver; then
    echo "no NVIDIA driver found: no /proc/driver/nvidia/version and no libnvidia-ml.so.1 in the loader cache; run with --sim to exercise the script against nvml-sim"
    exit 0
fi

OUT="${REAL_GPU_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpuwatch-real-gpu.XXXXXX")}"
mkdir -p "$OUT"
FAILED=0
step() { echo; echo "== $*"; }
fail() { echo "FAILED: $*"; FAILED=1; }

# ---- 1. build -------------------------------------------------------------------------------
if [ -z "${GPUWATCH_BIN:-}" ] || [ -z "${NVML_LATENCY_BIN:-}" ] || { [ "$SIM" = 1 ] && [ -z "${NVML_SIM_LIB:-}" ]; }; then
    step "build (release)"
    { cargo build --release -q -p gpuwatch -p nvml-sim &&
        cargo build --release -q -p gpuwatch --example nvml_latency --example floor; } || { echo "FAILED: build"; exit 1; }
fi
GW="${GPUWATCH_BIN:-$ROOT/target/release/gpuwatch}"
LAT="${NVML_LATENCY_BIN:-$ROOT/target/release/examples/nvml_latency}"
SIMLIB="${NVML_SIM_LIB:-$ROOT/target/release/libnvml_sim.so}"
if [ "$SIM" = 1 ]; then
    GWARGS=(--nvml-lib "$SIMLIB" --sim healthy)
    LATARGS=(--nvml-lib "$SIMLIB" --sim healthy)
    RECORD_S="${REAL_GPU_RECORD_S:-5}"
else
    GWARGS=()
    LATARGS=()
    RECORD_S="${REAL_GPU_RECORD_S:-60}"
fi
echo "gpuwatch: $GW"
echo "outputs: $OUT"

# ---- 2. one-shot commands ---------------------------------------------------------------------
step "gpuwatch devices"
"$GW" "${GWARGS[@]}" devices | tee "$OUT/devices.txt" || fail "devices"
step "gpuwatch status --json"
if "$GW" "${GWARGS[@]}" status --json >"$OUT/status.json"; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%d GPUs, driver %s, %d missing" % (len(d["gpus"]), d["driver_version"], len(d.get("missing", []))))' "$OUT/status.json" || fail "status --json is not JSON"
else
    fail "status --json"
fi
step "gpuwatch doctor"
"$GW" "${GWARGS[@]}" doctor | tee "$OUT/doctor.txt"
rc=${PIPESTATUS[0]}
[ "$rc" -le 1 ] || fail "doctor exited $rc"

# ---- 3. record beside nvidia-smi, compare ---------------------------------------------------------
SMI_FIELDS="timestamp,index,uuid,utilization.gpu,utilization.memory,memory.used,memory.total,temperature.gpu,power.draw,enforced.power.limit,clocks.sm,clocks.mem,fan.speed,pstate,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total"
step "record ${RECORD_S} s"
SMI_PID=""
if [ "$SIM" = 0 ] && command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu="$SMI_FIELDS" --format=csv -lms 1000 >"$OUT/nvidia-smi.csv" 2>"$OUT/nvidia-smi.err" &
    SMI_PID=$!
elif [ "$SIM" = 0 ]; then
    echo "skipped: nvidia-smi comparison: nvidia-smi is not on PATH"
fi
"$GW" "${GWARGS[@]}" record --interval 1s --duration "${RECORD_S}s" --out "$OUT/record.csv" || fail "record"
[ -n "$SMI_PID" ] && { kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; }
rows=$(($(wc -l <"$OUT/record.csv") - 1))
echo "recorded $rows device-samples into $OUT/record.csv"
[ "$rows" -gt 0 ] || fail "empty recording"

compare() { # gpuwatch.csv nvidia-smi.csv strict(0/1)
    python3 - "$@" <<'PY'
import csv, statistics, sys
gw_path, smi_path, strict = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
# gpuwatch key, nvidia-smi column, scale gpuwatch→smi unit, tolerance kind, tolerance
FIELDS = [
    ("temp", "temperature.gpu", 1, "abs", 2),
    ("power", "power.draw", 1, "rel", 0.10),
    ("power_limit", "enforced.power.limit", 1, "rel", 0.01),
    ("mem_used", "memory.used", 1 / 1048576, "rel", 0.01),
    ("mem_total", "memory.total", 1 / 1048576, "rel", 0.01),
    ("util", "utilization.gpu", 1, "abs", 15),
    ("mem_util", "utilization.memory", 1, "abs", 15),
    ("sm_clock", "clocks.sm", 1, "rel", 0.10),
    ("mem_clock", "clocks.mem", 1, "rel", 0.10),
    ("fan", "fan.speed", 1, "abs", 5),
    ("pstate", "pstate", 1, "abs", 0),
    ("ecc_corrected", "ecc.errors.corrected.volatile.total", 1, "abs", 0),
    ("ecc_uncorrected", "ecc.errors.uncorrected.volatile.total", 1, "abs", 0),
]
def num(s):
    s = (s or "").strip()
    if s.startswith("P") and s[1:].isdigit():
        return float(s[1:])
    try:
        return float(s.split()[0])
    except (ValueError, IndexError):
        return None
gw = {}
with open(gw_path, newline="") as f:
    for row in csv.DictReader(f):
        for key, *_ in FIELDS:
            v = num(row.get(key))
            if v is not None:
                gw.setdefault((row["uuid"], key), []).append(v)
smi = {}
with open(smi_path, newline="") as f:
    reader = csv.reader(f, skipinitialspace=True)
    header = [h.split(" [")[0].strip() for h in next(reader)]
    for r in reader:
        row = dict(zip(header, (c.strip() for c in r)))
        for _, col, *_ in FIELDS:
            v = num(row.get(col))
            if v is not None and "uuid" in row:
                smi.setdefault((row["uuid"], col), []).append(v)
bad = compared = 0
print(f"{'GPU':<14} {'FIELD':<40} {'GPUWATCH':>12} {'NVIDIA-SMI':>12}  RESULT")
for uuid in sorted({u for u, _ in gw}):
    for key, col, scale, kind, tol in FIELDS:
        a, b = gw.get((uuid, key)), smi.get((uuid, col))
        if not a or not b:
            continue
        ma, mb = statistics.median(a) * scale, statistics.median(b)
        diff = abs(ma - mb)
        ok = diff <= (tol if kind == "abs" else tol * max(abs(mb), 1e-9)) + 1e-9
        compared += 1
        bad += not ok
        print(f"{uuid[:14]:<14} {key + ' / ' + col:<40} {ma:>12.2f} {mb:>12.2f}  {'ok' if ok else 'OUT OF TOLERANCE'}")
print(f"{compared} field comparisons, {bad} out of tolerance")
sys.exit(1 if (bad and strict) or compared == 0 else 0)
PY
}
step "compare with nvidia-smi"
if [ "$SIM" = 1 ]; then
    echo "skipped: nvidia-smi comparison: no nvidia-smi under --sim; comparing the paired fixtures instead"
    compare tests/fixtures/traces/healthy.gpuwatch.csv tests/fixtures/traces/healthy.smi.csv 0 >"$OUT/compare.txt" || fail "comparison (fixtures)"
    tail -n 1 "$OUT/compare.txt"
    # the minute recorded by both tools on a real H200 must stay within tolerance (strict)
    compare tests/fixtures/real/idle-minute.gpuwatch.csv tests/fixtures/real/idle-minute.smi.csv 1 >"$OUT/compare-real.txt" || fail "comparison (real H200 minute)"
    tail -n 1 "$OUT/compare-real.txt"
elif [ -s "$OUT/nvidia-smi.csv" ]; then
    compare "$OUT/record.csv" "$OUT/nvidia-smi.csv" 1 | tee "$OUT/compare.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || fail "fields out of tolerance (see $OUT/compare.txt)"
fi

# ---- 4. NVML call latency ---------------------------------------------------------------------------
step "NVML call latency (50 calls each)"
"$LAT" "${LATARGS[@]}" --calls 50 | tee "$OUT/nvml-latency.txt"
[ "${PIPESTATUS[0]}" = 0 ] || fail "nvml_latency"

# ---- 5. a real training trace ------------------------------------------------------------------------
step "PyTorch trace"
if [ "$SIM" = 1 ]; then
    echo "skipped: PyTorch trace: not recorded against nvml-sim"
elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "skipped: PyTorch trace: torch with CUDA is not importable"
else
    DEST="$ROOT/tests/fixtures/real"
    mkdir -p "$DEST"
    GPU_NAME=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpus"][0]["name"])' "$OUT/status.json")
    DRIVER=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["driver_version"])' "$OUT/status.json")
    TRACE="$DEST/dataloader-stall.gpuwatch.csv"
    "$GW" record --interval 1s --duration 130s --out "$TRACE" &
    REC=$!
    sleep 5
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 - <<'PY' >"$OUT/train.log" 2>&1
import time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self): return 10**6
    def __getitem__(self, i):
        if i % 256 == 0: time.sleep(2.0)   # a stalled loader every 8 batches
        return torch.randn(3, 64, 64), i % 10
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.time() + 115
for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=32, num_workers=0)):
    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0: print(f"step {step} loss {loss.item():.3f}", flush=True)
    if time.time() > end: break
PY
    wait "$REC"
    # The GPU and driver beside the trace; README.md (what the files are) is written by people
    # and only created here when missing.
    cat >"$DEST/dataloader-stall.txt" <<EOF
dataloader-stall.gpuwatch.csv: gpuwatch record --interval 1s, 130 s, over a small PyTorch training
loop on GPU 0 whose DataLoader sleeps 2 s every 256 samples (bench/real-gpu.sh step 5).
GPU: $GPU_NAME
Driver: $DRIVER
Recorded: $(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
    [ -e "$DEST/README.md" ] || cp "$DEST/dataloader-stall.txt" "$DEST/README.md"
    echo "trace: $TRACE"
    step "GPM under a tiny-kernel loop, a bf16 GEMM loop and a copy loop (15 s each)"
    GPM_STATE=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpus"][0].get("gpm", {}).get("state", "unknown"))' "$OUT/status.json")
    if [ "$GPM_STATE" != active ]; then
        echo "skipped: GPM loads: GPM on GPU 0 is $GPM_STATE (see status.json gpus[0].gpm)"
    else
        "$GW" record --interval 1s --duration 52s --out "$OUT/gpm-loads.csv" &
        REC=$!
        sleep 2
        CUDA_VISIBLE_DEVICES=0 python3 - >"$OUT/gpm-loads.log" 2>&1 <<'PY'
import time, torch
def run(name, f, seconds=15):
    print(f"{name} {time.time():.3f}", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(100): f()
        torch.cuda.synchronize()
x = torch.zeros(1, device="cuda")
run("tiny", lambda: x.add_(1))                                  # one-element kernels back to back
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
run("gemm", lambda: a @ a)                                      # tensor cores
src = torch.empty(1 << 28, device="cuda"); dst = torch.empty_like(src)
run("copy", lambda: dst.copy_(src))                             # DRAM bandwidth
print(f"end {time.time():.3f}", flush=True)
PY
        wait "$REC"
        python3 - "$OUT/gpm-loads.csv" "$OUT/gpm-loads.log" <<'PY' | tee "$OUT/gpm-loads.txt"
import csv, statistics, sys, datetime
marks = [l.split() for l in open(sys.argv[2]) if l.split() and l.split()[0] in ("tiny", "gemm", "copy", "end")]
spans = [(n, float(t), float(marks[i + 1][1])) for i, (n, t) in enumerate(marks[:-1])]
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["index"] == "0"]
def t(r): return datetime.datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp()
keys = ["util", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp32_active"]
print("LOOP  " + "  ".join(f"{k:>13}" for k in keys))
for name, a, b in spans:
    sel = [r for r in rows if a + 2 <= t(r) <= b]
    med = lambda k: statistics.median([float(r[k]) for r in sel if r[k]]) if any(r[k] for r in sel) else float("nan")
    print(f"{name:<5} " + "  ".join(f"{med(k):13.1f}" for k in keys))
PY
    fi
fi

# ---- 6. CPU per device-sample beside gpustat, and the daemon, on this driver -------------------------
step "gpuwatch record and daemon beside the floor (and gpustat, nvitop) on this driver"
if [ "$SIM" = 1 ]; then
    echo "skipped: side-by-side CPU: bench/sampler.sh measures it on nvml-sim"
else
    PEERS=()
    python3 -c 'import gpustat, nvitop' 2>/dev/null && PEERS=(--peers)
    for pass in "${PEERS[@]:-}" --no-gpm; do
        python3 bench/sampler.py --seconds "${REAL_GPU_BENCH_S:-60}" --gpuwatch "$GW" \
            --floor target/release/examples/floor $pass | tee -a "$OUT/sampler.txt"
        [ "${PIPESTATUS[0]}" = 0 ] || fail "side-by-side CPU"
    done
fi

step "gpuwatch daemon on this driver: CPU and peak RSS"
if [ "$SIM" = 1 ]; then
    echo "skipped: daemon CPU and RSS: bench/daemon.sh measures them on nvml-sim"
else
    python3 bench/daemon.py --seconds "${REAL_GPU_DAEMON_S:-60}" --scenario real --gpuwatch "$GW" \
        --rules rules | tee "$OUT/daemon.json"
    [ "${PIPESTATUS[0]}" = 0 ] || fail "daemon"
fi

echo
if [ "$FAILED" = 0 ]; then echo "real-gpu.sh: done; outputs in $OUT"; else echo "real-gpu.sh: some steps failed; outputs in $OUT"; fi
exit "$FAILED"
