#!/usr/bin/env bash
# mmdebstrap --customize-hook for tests/testhost/build-image.sh: $1 is the new Debian 12 root.
# Runs outside the chroot, as the builder. Adds:
#   - /srv/gpum-test/debian-docker: Debian's docker.io and every .deb it needs on this rootfs;
#   - /srv/gpum-test/apt/{docker,nvidia}: two local apt repositories, each signed (InRelease) by
#     its own throwaway key made here, and the armored keys plus a WRONG one beside them;
#   - the SIMULATED NVIDIA driver (libnvidia-ml.so.1, nvidia-smi, /etc/gpum-sim/gpu.json);
#   - systemd units: the apt server on 127.0.0.1:8088, the platform on 127.0.0.1:8443, the
#     test CA, and a docker.service drop-in that loads the probe image;
#   - /etc/gpum-test/host.json (fingerprints, probe image id) and installer.json (test knobs);
# and removes Debian's sources: no scenario reaches the network.
set -euo pipefail

root="$1"
here="${GPUM_TESTHOST_DIR:?}"
work="${GPUM_TESTHOST_WORK:?}"
sim="$here/../sim"
srv="$root/srv/gpum-test"
log() { printf 'customize: %s\n' "$*" >&2; }

# --- Docker: Debian's packages, downloaded now so that no scenario needs the network.
log "downloading docker.io and its dependencies"
chroot "$root" apt-get install -y -q --download-only --no-install-recommends docker.io >/dev/null
mkdir -p "$srv/debian-docker" "$srv/apt/docker/pool/stable"
mv "$root"/var/cache/apt/archives/*.deb "$srv/debian-docker/"
cp "$srv"/debian-docker/*.deb "$srv/apt/docker/pool/stable/"

# Debian's docker.io Conflicts: docker-ce, docker-ce-cli, docker-ce-rootless-extras, the names
# the installer asks for. The repository's copy is Debian's package with only that control line
# removed (and "+gpumtest1" appended to its version); its data.tar is Debian's, byte for byte.
dio="$(ls "$srv"/apt/docker/pool/stable/docker.io_*.deb)"
rm -f "$dio"
mkdir -p "$work/dio/control"
(cd "$work/dio" && ar x "$srv"/debian-docker/docker.io_*.deb)
ctl="$(cd "$work/dio" && ls control.tar.*)"
tar -C "$work/dio/control" -xf "$work/dio/$ctl"
sed -i '/^Conflicts:/d; s/^Version: .*/&+gpumtest1/' "$work/dio/control/control"
dio_version="$(sed -n 's/^Version: //p' "$work/dio/control/control")"
rm "$work/dio/$ctl"
tar -C "$work/dio/control" --owner=0 --group=0 -cJf "$work/dio/control.tar.xz" .
data="$(cd "$work/dio" && ls data.tar.*)"
(cd "$work/dio" && ar rcD "$srv/apt/docker/pool/stable/docker.io_${dio_version//:/%3a}_amd64.deb" debian-binary control.tar.xz "$data")

# Metapackages with Docker's names, built with dpkg-deb.
meta() { # NAME VERSION DEPENDS DIR
    local d="$work/meta/$1"
    mkdir -p "$d/DEBIAN"
    {
        printf 'Package: %s\nVersion: %s\nArchitecture: amd64\nMaintainer: gpum tests <tests@gpum.invalid>\n' "$1" "$2"
        [ -z "$3" ] || printf 'Depends: %s\n' "$3"
        printf 'Section: admin\nPriority: optional\n'
        printf 'Description: TEST metapackage of the gpum test host (SIMULATION of a vendor package name)\n'
        printf ' Stands in for the package of the same name from the vendor repository;\n'
        printf ' the software itself is Debian'"'"'s (see docs/testhost.md).\n'
    } >"$d/DEBIAN/control"
    dpkg-deb --root-owner-group -Zxz -b "$d" "$4/${1}_${2//:/%3a}_amd64.deb" >/dev/null
}
v="5:20.10.24~gpumtest-1~debian.12~bookworm"
meta docker-ce "$v" "docker.io (= $dio_version)" "$srv/apt/docker/pool/stable"
meta docker-ce-cli "$v" "docker.io (= $dio_version)" "$srv/apt/docker/pool/stable"
meta containerd.io "1.6.20~gpumtest-1" "containerd" "$srv/apt/docker/pool/stable"
meta docker-buildx-plugin "0.10.4~gpumtest-1~debian.12~bookworm" "" "$srv/apt/docker/pool/stable"
meta docker-compose-plugin "2.17.2~gpumtest-1~debian.12~bookworm" "" "$srv/apt/docker/pool/stable"

# --- NVIDIA: the SIMULATED toolkit, two versions (1.17.4 has a known CVE; 1.17.8 is current).
toolkit() { # VERSION
    local d="$work/toolkit-$1"
    mkdir -p "$d/DEBIAN" "$d/usr/bin"
    sed "s/@VERSION@/$1/" "$sim/toolkit/nvidia-ctk" >"$d/usr/bin/nvidia-ctk"
    cp "$sim/toolkit/nvidia-container-runtime-hook" "$d/usr/bin/"
    chmod 0755 "$d"/usr/bin/*
    # The real runtime is a runc shim that adds the hook; a plain runc is enough here.
    ln -s /usr/sbin/runc "$d/usr/bin/nvidia-container-runtime"
    # The real package writes /etc/nvidia-container-runtime/config.toml in its postinst
    # (`nvidia-ctk config --in-place`: the defaults, keeping values already set); the simulated
    # one installs the defaults as the real one writes them (tests/fixtures/preflight/) when the
    # file is absent and keeps an existing file.
    mkdir -p "$d/usr/share/gpum-sim-toolkit"
    cp "$here/../fixtures/preflight/nvidia-container-runtime-config.toml" "$d/usr/share/gpum-sim-toolkit/config.toml"
    cat >"$d/DEBIAN/postinst" <<'PI'
#!/bin/sh
# SIMULATION of nvidia-container-toolkit-base's postinst (tests/testhost/customize.sh).
set -e
if [ "$1" = configure ] && [ ! -e /etc/nvidia-container-runtime/config.toml ]; then
    mkdir -p /etc/nvidia-container-runtime
    cp /usr/share/gpum-sim-toolkit/config.toml /etc/nvidia-container-runtime/config.toml
fi
PI
    chmod 0755 "$d/DEBIAN/postinst"
    cat >"$d/DEBIAN/control" <<CTL
Package: nvidia-container-toolkit
Version: $1-1
Architecture: amd64
Maintainer: gpum tests <tests@gpum.invalid>
Depends: jq
Section: utils
Priority: optional
Description: SIMULATION of the NVIDIA Container Toolkit for the gpum test host
 A simulated nvidia-ctk and nvidia-container-runtime-hook (tests/sim/toolkit/).
 This is not NVIDIA software.
CTL
    dpkg-deb --root-owner-group -Zxz -b "$d" "$srv/apt/nvidia/nvidia-container-toolkit_$1-1_amd64.deb" >/dev/null
}
mkdir -p "$srv/apt/nvidia"
toolkit 1.17.4
toolkit 1.17.8

# --- Keys: one per repository, and a wrong one. Throwaway, made at each build.
export GNUPGHOME="$work/gnupg"
mkdir -p "$GNUPGHOME" && chmod 0700 "$GNUPGHOME"
key() { # NAME USERID
    gpg --batch -q --passphrase '' --quick-gen-key "$2" ed25519 sign never
    local fpr
    fpr="$(gpg --batch --with-colons --list-keys "$2" | awk -F: '$1=="fpr"{print $10; exit}')"
    gpg --batch --armor --export "$fpr" >"$srv/apt/$1.asc"
    printf '%s' "$fpr"
}
docker_fpr="$(key docker 'gpum TEST docker repository key <tests@gpum.invalid>')"
nvidia_fpr="$(key nvidia 'gpum TEST nvidia repository key <tests@gpum.invalid>')"
wrong_fpr="$(key wrong 'gpum TEST wrong key <tests@gpum.invalid>')"

sign() { # DIR FPR
    gpg --batch -q --yes -u "$2" --clearsign -o "$1/InRelease" "$1/Release"
    gpg --batch -q --yes -u "$2" -abs -o "$1/Release.gpg" "$1/Release"
}
# The docker repository: suite bookworm, component stable.
(
    cd "$srv/apt/docker"
    mkdir -p dists/bookworm/stable/binary-amd64
    apt-ftparchive packages pool/stable >dists/bookworm/stable/binary-amd64/Packages
    gzip -9kn dists/bookworm/stable/binary-amd64/Packages
    apt-ftparchive -o APT::FTPArchive::Release::Origin=gpum-test -o APT::FTPArchive::Release::Suite=bookworm \
        -o APT::FTPArchive::Release::Codename=bookworm -o APT::FTPArchive::Release::Components=stable \
        -o APT::FTPArchive::Release::Architectures=amd64 release dists/bookworm >"$work/Release"
    mv "$work/Release" dists/bookworm/Release
)
sign "$srv/apt/docker/dists/bookworm" "$docker_fpr"
# The nvidia repository: flat ("Suites: /"), like NVIDIA's.
(
    cd "$srv/apt/nvidia"
    apt-ftparchive packages . >Packages
    gzip -9kn Packages
    apt-ftparchive -o APT::FTPArchive::Release::Origin=gpum-test release . >"$work/Release"
    mv "$work/Release" Release
)
sign "$srv/apt/nvidia" "$nvidia_fpr"

# --- The SIMULATED NVIDIA driver layer.
log "simulated NVIDIA layer"
mkdir -p "$root/usr/lib/gpum-sim" "$root/etc/gpum-sim" "$root/usr/lib/x86_64-linux-gnu"
cc -O2 -Wall -shared -fPIC -o "$root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" "$sim/nvml/libnvidia-ml-sim.c"
install -m 0755 "$sim/nvidia-smi" "$root/usr/lib/gpum-sim/nvidia-smi"
install -m 0755 "$sim/nvidia-smi" "$root/usr/bin/nvidia-smi"
install -m 0644 "$sim/gpu.json" "$root/etc/gpum-sim/gpu.json"
install -m 0644 "$work/probe-image.tar" "$root/usr/lib/gpum-sim/probe-image.tar"
install -m 0755 "$here/files/load-probe-image" "$root/usr/lib/gpum-sim/load-probe-image"

# --- Units, entry points, files.
cp -r "$here/files/etc/." "$root/etc/"
install -m 0755 "$here/files/gpum-testhost-init" "$root/usr/local/sbin/gpum-testhost-init"
install -m 0755 "$here/files/gpum-testhost-nosystemd" "$root/usr/local/sbin/gpum-testhost-nosystemd"
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
for u in gpum-test-apt.service gpum-test-ca.service gpum-test-platform.service; do
    ln -sf "/etc/systemd/system/$u" "$root/etc/systemd/system/multi-user.target.wants/$u"
done
probe_id="$(cat "$work/probe-image-id")"
mkdir -p "$root/etc/gpum-test"
jq -n --arg d "$docker_fpr" --arg n "$nvidia_fpr" --arg w "$wrong_fpr" --arg p "$probe_id" --arg dv "$dio_version" \
    '{docker_fingerprint:$d, nvidia_fingerprint:$n, wrong_fingerprint:$w, probe_image_id:$p, docker_io_version:$dv}' \
    >"$root/etc/gpum-test/host.json"
jq -n --arg d "$docker_fpr" --arg n "$nvidia_fpr" '{
    repos: {
        docker: {uri: "http://127.0.0.1:8088/docker", suite: "bookworm", components: ["stable"],
                 key_url: "http://127.0.0.1:8088/docker.asc", fingerprints: [$d]},
        nvidia: {uri: "http://127.0.0.1:8088/nvidia", suite: "/", components: [],
                 key_url: "http://127.0.0.1:8088/nvidia.asc", fingerprints: [$n]}
    },
    release_key: "/opt/gpum-e2e/release.asc",
    crash_at: null
}' >"$root/etc/gpum-test/installer.json"
printf 'GPUM_TEST_DIST=/opt/gpum-e2e/dist\n' >"$root/etc/gpum-test/platform.env"
printf '0\n' >"$root/etc/gpum-test/clock"

# A user without sudo rights, for "not root".
chroot "$root" useradd -m -s /bin/bash -u 1000 owner

# No network: Debian's sources go; apt knows only what the installer adds.
rm -f "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
log "done (docker $docker_fpr, nvidia $nvidia_fpr)"
