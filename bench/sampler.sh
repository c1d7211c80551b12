#!/usr/bin/env bash
# CPU time per device-sample, ticks kept and peak RSS, 8 simulated GPUs at 100 ms and at 1 s, all
# started together against the same simulated libnvidia-ml.so.1 with nvml-sim's call costs
# (measured on an H200; release builds; NVML_SIM_LATENCY=0 to compare without): `gpuwatch record`,
# `gpuwatch daemon` (every stock rule, exporter on), the floor (`bench/floor.rs`: the sampler's NVML
# calls at its cadences and nothing else, on one thread), and for context gpustat's and nvitop's
# own query loops. The headline is gpuwatch's CPU per device-sample over the floor's (target
# <= 1.3), with GPM on and with --no-gpm; nvml-sim's call counts show that gpuwatch and the floor made the same calls.
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
cargo build --release -q --example floor
# gpustat and nvitop (context) beside the first pass only
for pass in --peers --no-gpm; do
    "$PEERS/bin/python" bench/sampler.py --seconds "$SECONDS_TO_RUN" "$pass" \
        --gpuwatch target/release/gpuwatch --floor target/release/examples/floor \
        --sim-lib target/release/libnvml_sim.so
done
