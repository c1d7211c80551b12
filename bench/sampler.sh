#!/usr/bin/env bash
# CPU time per device-sample, ticks kept and peak RSS: gpuwatch vs gpustat, 8 simulated GPUs at
# 100 ms and at 1 s, both running side by side against the same simulated libnvidia-ml.so.1 with
# nvml-sim's realistic call latencies (release builds; NVML_SIM_LATENCY=0 to compare without).
#
#   bash bench/sampler.sh [SECONDS]        (default 60: the measured window; needs .venv-ci from
#                                           .ci/run, or GPUWATCH_PEERS=<venv with gpustat>)
#   bash bench/sampler.sh [SECONDS] --gpm  (GPM's cost instead: `gpuwatch record` with GPM, read at
#                                           every tick on these H100s, beside `gpuwatch --no-gpm
#                                           record`, same library, same run; no gpustat needed)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-60}"
if [ "${2:-}" = "--gpm" ]; then
    cargo build --release -q -p gpuwatch -p nvml-sim
    exec python3 bench/sampler.py --gpm --seconds "$SECONDS_TO_RUN" \
        --gpuwatch target/release/gpuwatch --sim-lib target/release/libnvml_sim.so
fi
PEERS="${GPUWATCH_PEERS:-$PWD/.venv-ci}"
if [ ! -x "$PEERS/bin/python" ]; then
    python3 -m venv "$PEERS"
    "$PEERS/bin/python" -m pip install --quiet nvidia-ml-py gpustat nvitop
fi
cargo build --release -q -p gpuwatch -p nvml-sim
exec "$PEERS/bin/python" bench/sampler.py --seconds "$SECONDS_TO_RUN" \
    --gpuwatch target/release/gpuwatch --sim-lib target/release/libnvml_sim.so
