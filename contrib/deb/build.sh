#!/usr/bin/env bash
# Builds the gpuwatch .deb from a release executable, with dpkg-deb alone (no debhelper, no
# cargo-deb: nothing to install or compile beyond the executable itself).
#
#   bash contrib/deb/build.sh [EXECUTABLE] [OUT_DIR]
#
# EXECUTABLE defaults to target/release/gpuwatch (built with `cargo build --release` when
# missing; it carries the simulated library, so `gpuwatch --sim …` works from the package);
# OUT_DIR to target/deb. Prints the path of the .deb. What goes where, and why, is in
# docs/install.md ("The .deb").
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
exe="${1:-$root/target/release/gpuwatch}"
out="${2:-$root/target/deb}"
if [ ! -x "$exe" ]; then
    (cd "$root" && cargo build --release -p gpuwatch)
fi
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)"
arch="$(dpkg --print-architecture)"
# The newest glibc symbol version the executable needs is the package's libc6 dependency.
glibc="$(grep -aoE 'GLIBC_2\.[0-9]+(\.[0-9]+)?' "$exe" | sed 's/^GLIBC_//' | sort -uV | tail -n 1)"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
pkg="$stage/gpuwatch"
install -D -m 0755 "$exe" "$pkg/usr/bin/gpuwatch"
install -d -m 0755 "$pkg/usr/share/gpuwatch/rules"
install -m 0644 "$root"/rules/*.rhai "$pkg/usr/share/gpuwatch/rules/"
install -D -m 0644 "$root/contrib/deb/config.toml" "$pkg/etc/gpuwatch/config.toml"
# The hardened unit of contrib/, run as the gpuwatch user: CAP_KILL and CAP_SYSLOG (the only two
# capabilities it bounds to) become ambient, so kills under [actions.kill] and the kernel-log
# XID source work without root; StateDirectory= and LogsDirectory= are then owned by gpuwatch.
install -d -m 0755 "$pkg/usr/lib/systemd/system"
sed -e 's|^ExecStart=/usr/local/bin/gpuwatch |ExecStart=/usr/bin/gpuwatch |' \
    -e '/^CapabilityBoundingSet=/a\
# The gpuwatch system user (made by the package; in group video for /dev/nvidia* where the\
# driver restricts them), with the two capabilities above as its only privileges.\
User=gpuwatch\
Group=gpuwatch\
AmbientCapabilities=CAP_KILL CAP_SYSLOG' \
    -e 's|^#   install -m 0644 contrib/gpuwatch.service /etc/systemd/system/$|#   (installed by the gpuwatch package; runs as the gpuwatch user, see User= below)|' \
    "$root/contrib/gpuwatch.service" > "$pkg/usr/lib/systemd/system/gpuwatch.service"
chmod 0644 "$pkg/usr/lib/systemd/system/gpuwatch.service"
grep -q '^ExecStart=/usr/bin/gpuwatch daemon' "$pkg/usr/lib/systemd/system/gpuwatch.service"
grep -q '^User=gpuwatch$' "$pkg/usr/lib/systemd/system/gpuwatch.service"
doc="$pkg/usr/share/doc/gpuwatch"
install -d -m 0755 "$doc"
install -m 0644 "$root/README.md" "$root/config.example.toml" "$root/docs/notifications.md" \
    "$root/docs/rules.md" "$root/docs/metrics.md" "$root/docs/install.md" "$doc/"
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: gpuwatch"
    echo
    echo "Files: *"
    echo "License: MIT or Apache-2.0"
    echo
    echo "License: MIT"
    sed 's/^$/./; s/^/ /' "$root/LICENSE-MIT"
    echo
    echo "License: Apache-2.0"
    echo " On Debian systems the full text of the Apache License 2.0 is in"
    echo " /usr/share/common-licenses/Apache-2.0."
} > "$doc/copyright"
chmod 0644 "$doc/copyright"

install -d -m 0755 "$pkg/DEBIAN"
installed_kb="$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)"
cat > "$pkg/DEBIAN/control" <<CONTROL
Package: gpuwatch
Version: $version
Architecture: $arch
Maintainer: gpuwatch developers <gpuwatch@localhost>
Installed-Size: $installed_kb
Depends: libc6 (>= $glibc), adduser, init-system-helpers (>= 1.54), util-linux
Suggests: libnvidia-ml1 | nvidia-driver
Section: admin
Priority: optional
Description: GPU watchdog for unattended deep-learning training
 gpuwatch samples every NVIDIA GPU through NVML, evaluates rhai rules over
 rolling windows and sends alerts (e-mail, Slack, ntfy, Telegram, Alertmanager
 and more) with Prometheus-style semantics and a durable outbox. It serves
 /metrics under dcgm-exporter's names, records and replays metric logs, and
 stops runaway jobs only under a strict, audited policy.
 .
 The package installs the daemon as a hardened systemd unit running as the
 gpuwatch user, enabled but not started; "gpuwatch --sim SCENARIO" runs any
 command on simulated GPUs.
CONTROL
echo "/etc/gpuwatch/config.toml" > "$pkg/DEBIAN/conffiles"
install -m 0755 "$root/contrib/deb/postinst" "$root/contrib/deb/prerm" "$root/contrib/deb/postrm" "$pkg/DEBIAN/"
mkdir -p "$out"
deb="$out/gpuwatch_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
echo "$deb"
