#!/usr/bin/env bash
# `gpuwatch check` on configs with N webhook channels and N routes (N = 10k, 20k, 40k): the time
# must grow linearly with the file (positions come from a line index, names from hash sets).
#
#   bash bench/check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p gpuwatch
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in 10000 20000 40000; do
    python3 - "$n" "$tmp/c$n.toml" <<'PY'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
lines = ['[daemon]', 'state_dir = "state"', '']
for i in range(n):
    lines += ['[[channel]]', f'name = "c{i}"', 'type = "webhook"', f'url = "http://127.0.0.1:9/hook/{i}"', '']
for i in range(n):
    lines += ['[[route]]', f'channels = ["c{i}"]', f'rules = ["r{i}"]', '']
open(path, 'w').write('\n'.join(lines))
PY
    start=$(date +%s.%N)
    target/release/gpuwatch check --config "$tmp/c$n.toml" > /dev/null
    end=$(date +%s.%N)
    printf '%6d channels + %6d routes: %.2f s\n' "$n" "$n" "$(echo "$end - $start" | bc)"
done
