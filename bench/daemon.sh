#!/usr/bin/env bash
# Daemon benchmark: notification latency (tripping sample → webhook received) and CPU / RSS of
# `gpuwatch daemon` with 8 simulated GPUs, every stock rule, 1 s interval (release builds).
#
#   bash bench/daemon.sh [SECONDS] [SCENARIO] [--no-gpm]    (defaults: 120, xid-79, GPM on)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p gpuwatch -p nvml-sim
exec python3 bench/daemon.py --seconds "${1:-120}" --scenario "${2:-xid-79}" \
    --gpuwatch target/release/gpuwatch --rules rules "${@:3}"
