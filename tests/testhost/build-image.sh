#!/usr/bin/env bash
# Builds the gpum test host images (see docs/testhost.md):
#   BASE_TAG    Debian 12 with systemd, a local signed apt repository for Docker's and NVIDIA's
#               package names, the SIMULATED NVIDIA driver layer, and no Docker installed;
#   DOCKER_TAG  the same with Debian's own docker.io installed (the "Docker present" host).
# Usage: build-image.sh BASE_TAG DOCKER_TAG
# The tags are chosen by tests/src/testhost/image.rs from a hash of everything this script
# reads (this directory, tests/sim/ and the toolkit settings fixture), so an edit rebuilds and an
# unchanged recipe is reused.
# Needs root (or user namespaces for mmdebstrap), mmdebstrap, dpkg-dev, apt-utils, gpg, cc,
# binutils (ar), busybox-static, and a Docker Engine. Debian's archive is the only network
# this touches; nothing in the images reaches the network later.
set -euo pipefail

base_tag="$1"
docker_tag="$2"
here="$(cd "$(dirname "$0")" && pwd)"
mirror="${GPUM_TESTHOST_MIRROR:-http://deb.debian.org/debian}"
security="${GPUM_TESTHOST_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"

work="$(mktemp -d "${TMPDIR:-/var/tmp}/gpum-e2e-build.XXXXXX")"
build_ctr="gpum-e2e-build-$$"
cleanup() {
    docker rm -f "$build_ctr" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

log() { printf 'build-image: %s\n' "$*" >&2; }

# 1. The probe image: busybox-static only. It has no nvidia-smi of its own: like NVIDIA's images,
#    it gets one from the (simulated) hook when it runs with a GPU request. It is imported on the
#    outer engine only to be saved as a tarball that the inner engine loads at its start.
log "probe image"
probe="$work/probe"
mkdir -p "$probe"/{bin,etc,tmp,proc,sys,dev,usr/bin}
cp /bin/busybox "$probe/bin/busybox"
for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -s busybox "$probe/bin/$applet"
done
printf 'root:x:0:0:root:/:/bin/sh\n' >"$probe/etc/passwd"
printf 'root:x:0:\n' >"$probe/etc/group"
tar -C "$probe" --owner=0 --group=0 -cf "$work/probe.tar" .
probe_ref="gpum-test/probe:sim"
probe_id="$(docker import --change 'CMD ["nvidia-smi"]' "$work/probe.tar" "$probe_ref")"
docker save -o "$work/probe-image.tar" "$probe_ref"
docker rmi "$probe_ref" >/dev/null
printf '%s\n' "$probe_id" >"$work/probe-image-id"
log "probe image id $probe_id"

# 2. The rootfs; customize.sh adds the repositories, the simulation and the units.
packages="$(grep -v '^#' "$here/packages.txt" | grep -v '^$' | paste -sd, -)"
log "mmdebstrap (packages: $packages)"
mmdebstrap --variant=minbase --include="$packages" \
    --customize-hook="GPUM_TESTHOST_DIR='$here' GPUM_TESTHOST_WORK='$work' '$here/customize.sh' \"\$1\"" \
    bookworm "$work/rootfs.tar" \
    "deb $mirror bookworm main" "deb $mirror bookworm-updates main" "deb $security bookworm-security main"

log "docker import $base_tag"
docker import "$work/rootfs.tar" "$base_tag" >/dev/null
rm -f "$work/rootfs.tar"

# 3. Docker present: Debian's unmodified docker.io and its dependencies, from the .debs saved in
#    the image, installed with no network.
log "docker variant $docker_tag"
docker run --name "$build_ctr" --network none --entrypoint /bin/sh "$base_tag" -c \
    'set -e; apt-get install -y -q --no-install-recommends /srv/gpum-test/debian-docker/*.deb >/tmp/apt.log 2>&1 || { cat /tmp/apt.log; exit 1; }; rm -f /tmp/apt.log; apt-get clean'
docker commit "$build_ctr" "$docker_tag" >/dev/null
log "done"
