#!/usr/bin/env bash
# What the tests need on a fresh Debian 12 / Ubuntu 22.04+ machine, installed when missing:
# `cargo xtask test` runs this first (skip with `cargo xtask test --no-setup`).
# - apt: musl-tools (the static platform build), busybox-static (the Docker suites' images),
#   the linter for install.sh, and for the test host (docs/testhost.md) mmdebstrap, debootstrap,
#   dpkg-dev and apt-utils (the local apt repositories), gpg and gpg-agent (their keys), jq,
#   binutils (ar, strip) and gcc (the simulated NVML library), chromium and chromium-driver (the
#   dashboard's browser tests, tests/e2e/dashboard.rs), lintian (the release's .deb, docs/release.md),
#   valgrind (the agent's instructions per heartbeat, counted by callgrind: xtask/src/bench/cost.rs),
#   tmux (the test host's progress-tty scenario: the installer in a terminal, its frames sampled),
#   postgresql (the platform's suites on PostgreSQL, issue 35: the tests start a private cluster of
#   their own with its initdb and pg_ctl, platform/src/testdb.rs; the package's own cluster is not used);
#   tinyproxy (a real HTTP proxy the agent's tunnel goes through, tests/e2e/tunnel.rs; the tests
#   start their own on loopback, the package's service is not used); python3-aiosmtpd (a real SMTP
#   server the owners' alerts are sent to, tests/e2e/platform_alerts.rs);
# - cargo: cargo-deb, pinned (the .deb that `cargo xtask dist` builds); rustup: the musl target (the
#   static platform);
# - pip: schemathesis (the platform against docs/openapi.yaml);
# - a running Docker Engine (started when installed but stopped).
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need_pkgs=()
for p in musl-tools debootstrap wget busybox-static shellcheck mmdebstrap dpkg-dev apt-utils gpg gpg-agent jq binutils gcc chromium chromium-driver lintian valgrind tmux postgresql tinyproxy python3-aiosmtpd; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need_pkgs+=("$p")
done
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    echo "setup: installing ${need_pkgs[*]}" >&2
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${need_pkgs[@]}"
fi

# Pinned: a newer cargo-deb may lay out the package differently (lintian, tests/e2e/dist.rs).
CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version 2>/dev/null | grep -qx "cargo-deb $CARGO_DEB_VERSION"; then
    echo "setup: installing cargo-deb $CARGO_DEB_VERSION" >&2
    cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION"
fi
if ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
    echo "setup: adding the x86_64-unknown-linux-musl target" >&2
    rustup target add x86_64-unknown-linux-musl
fi

if ! command -v schemathesis >/dev/null 2>&1 && ! command -v st >/dev/null 2>&1; then
    echo "setup: installing schemathesis" >&2
    python3 -m pip install -q schemathesis
fi

if command -v docker >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
    ($SUDO systemctl start docker 2>/dev/null || $SUDO service docker start 2>/dev/null || true)
    for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi
