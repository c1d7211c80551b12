#!/usr/bin/env bash
# Daemon benchmark: notification latency (tripping sample → webhook received) and CPU / RSS of
# `gpuwatch daemon` with 8 simulated GPUs, every stock rule, 1 s interval (release builds), and
# beside it the floor: the same NVML calls at the daemon's cadences and nothing else.
#
#   bash bench/daemon.sh [SECONDS] [SCENARIO] [--no-gpm] [--speed N] [--exporter]
#   (defaults: 120, xid-79, GPM on, real time, no /metrics); a simulated day with /metrics:
#   bash bench/daemon.sh 864 healthy --speed 100 --exporter
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p gpuwatch -p nvml-sim
cargo build --release -q --example floor
exec python3 bench/daemon.py --seconds "${1:-120}" --scenario "${2:-xid-79}" \
    --gpuwatch target/release/gpuwatch --rules rules \
    --floor target/release/examples/floor --sim-lib target/release/libnvml_sim.so "${@:3}"
