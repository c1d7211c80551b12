#!/usr/bin/env bash
# Import throughput and memory: a generated 1 GB nvidia-smi `--query-gpu` CSV (8 GPUs, 11
# fields, one burst a second) streamed through `gpuwatch import`: three runs with standard output
# on /dev/null, two with `--out /dev/null` (the device written in place — it was once renamed
# over, so that figure measured writes to a regular file in /dev) and one to a file; prints
# MB/s (input bytes / wall time) and peak RSS of each run, and checks /dev/null is still the
# null device.
#
#   bash bench/import.sh [MEGABYTES]     (default 1000; the log is written to $TMPDIR and removed)
set -euo pipefail
cd "$(dirname "$0")/.."
MB="${1:-1000}"
cargo build --release -q -p gpuwatch --bin gpuwatch --example gen_smi_csv
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
target/release/examples/gen_smi_csv "$dir/log.csv" "$MB"
bytes=$(stat -c %s "$dir/log.csv")
cat "$dir/log.csv" > /dev/null   # page cache warm: measure parsing, not the disk
run() {
    local label="$1"; shift
    /usr/bin/time -f "%e %M" -o "$dir/time" "$@" 2> "$dir/err"
    read -r secs kib < "$dir/time"
    python3 - "$label" "$bytes" "$secs" "$kib" "$(grep -c . "$dir/err" || true)" <<'PY'
import sys
label, b, s, k, _ = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
print(f"{label:<28} {b/1e6:8.0f} MB in {s:6.2f} s = {b/1e6/max(s,1e-9):6.0f} MB/s, peak RSS {k/1024:5.1f} MiB")
PY
}
for i in 1 2 3; do
    run "import > /dev/null (#$i)" sh -c "target/release/gpuwatch import '$dir/log.csv' > /dev/null"
done
for i in 1 2; do
    run "import --out /dev/null (#$i)" target/release/gpuwatch import "$dir/log.csv" --out /dev/null
done
[ -c /dev/null ] || { echo "/dev/null is no longer a character device" >&2; exit 1; }
run "import --out FILE" target/release/gpuwatch import "$dir/log.csv" --out "$dir/out.csv"
tail -1 "$dir/err"
echo "output $(stat -c %s "$dir/out.csv") bytes; for scale, the disk:"
rm -f "$dir/out.csv"
run "cp of the input (reference)" cp "$dir/log.csv" "$dir/copy.csv"
echo "targets: >= 150 MB/s to /dev/null (issue 27), <= 64 MiB peak RSS"
