#!/usr/bin/env bash
# Checks the REAL NVIDIA path on a machine with an NVIDIA GPU (no simulation here): the driver's
# NVML, nvidia-smi, the NVIDIA Container Toolkit and Docker's --gpus, then gpum's own audit.
# Run it as root on the GPU machine (vagrant/README.md), from a checkout or with the binaries beside it:
#   sudo tests/real-gpu/check.sh [PATH/TO/gpum-install]
# It prints one line per check and ends with "N passed, N failed"; exit 1 when any failed.
# It changes nothing, except pulling the probe image (GPUM_PROBE_IMAGE, default below) when absent.
# The toolkit, live-restore and egress checks judge a machine gpum has installed.
set -uo pipefail

image="${GPUM_PROBE_IMAGE:-nvidia/cuda:12.4.1-base-ubuntu22.04}"
installer="${1:-$(dirname "$0")/../../target/debug/gpum-install}"
passed=0
failed=0

check() { # NAME COMMAND...
    local name="$1"
    shift
    local out
    if out="$("$@" 2>&1)"; then
        printf '%-44s ok\n' "$name"
        passed=$((passed + 1))
    else
        printf '%-44s FAIL\n' "$name"
        printf '%s\n' "$out" | tail -n 8 | sed 's/^/    | /'
        failed=$((failed + 1))
    fi
}

check "libnvidia-ml.so.1 is installed" sh -c 'ldconfig -p | grep -q "libnvidia-ml.so.1 "'
check "nvidia-smi lists a GPU" sh -c 'nvidia-smi -L | grep -q "^GPU 0"'
check "nvidia-smi reports the driver version" nvidia-smi --query-gpu=driver_version,name,uuid --format=csv,noheader
check "nvidia-container-runtime-hook is on PATH" command -v nvidia-container-runtime-hook
check "nvidia-ctk is installed" nvidia-ctk --version
check "docker lists the nvidia runtime" sh -c 'docker info --format "{{json .Runtimes}}" | grep -q nvidia'
# After gpum's install the toolkit takes the GPU list of an unprivileged container only from
# device-list mounts (/dev/null at /var/run/nvidia-container-devices/<id>), not from its
# NVIDIA_VISIBLE_DEVICES (docs/agent.md, "How a rental gets its GPUs"): the probe and every rental
# add those mounts, and so do these checks.
toolkit_cfg=/etc/nvidia-container-runtime/config.toml
gpum_toolkit=no
if grep -Eq '^[[:space:]]*accept-nvidia-visible-devices-envvar-when-unprivileged[[:space:]]*=[[:space:]]*false' "$toolkit_cfg" 2>/dev/null &&
    grep -Eq '^[[:space:]]*accept-nvidia-visible-devices-as-volume-mounts[[:space:]]*=[[:space:]]*true' "$toolkit_cfg" 2>/dev/null; then
    gpum_toolkit=yes
fi
check "docker run --gpus all nvidia-smi (the probe's way)" \
    docker run --rm --gpus all -v /dev/null:/var/run/nvidia-container-devices/all:ro "$image" nvidia-smi
# Rentals (issue 33): the agent runs a rental with these flags (agent/src/docker/rental.rs,
# container_config): the rented GPU by UUID, as a device request and a device-list mount, and
# NVIDIA_VISIBLE_DEVICES set to it over the image's and the tenant's `all`, every capability
# dropped but seven, no-new-privileges, hard limits, public resolvers.
uuid0="$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -n 1)"
gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
rental=(docker run --rm --gpus "\"device=$uuid0\"" -v "/dev/null:/var/run/nvidia-container-devices/$uuid0:ro"
    -e NVIDIA_VISIBLE_DEVICES=all -e NVIDIA_VISIBLE_DEVICES="$uuid0"
    --cap-drop ALL --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add FOWNER --cap-add SETUID
    --cap-add SETGID --cap-add KILL --cap-add NET_BIND_SERVICE --security-opt no-new-privileges:true
    --pids-limit 4096 --ulimit nofile=16384:16384 --memory 2g --memory-swap 2g --shm-size 64m
    --dns 1.1.1.1 --dns 9.9.9.9 --ipc private --init --restart no "$image")
check "a rental's flags: nvidia-smi works" "${rental[@]}" nvidia-smi
check "a rental sees only its GPU ($gpus on this machine)" \
    sh -c "out=\$(\"\$@\" nvidia-smi -L) && [ \"\$(printf '%s\n' \"\$out\" | grep -c '^GPU ')\" = 1 ] && printf '%s' \"\$out\" | grep -q '$uuid0'" \
    _ "${rental[@]}"
if [ "$gpum_toolkit" = yes ]; then
    # The attack the setting closes: an unprivileged container naming GPUs in its own environment
    # under the nvidia runtime, with no device request and no mount.
    check "an image's own NVIDIA_VISIBLE_DEVICES=all gets no GPU" \
        sh -c "! docker run --rm --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=all '$image' nvidia-smi -L 2>/dev/null | grep -q '^GPU '"
else
    printf '%-44s skipped (%s lacks gpum'"'"'s two settings: run the installer first)\n' "image env NVIDIA_VISIBLE_DEVICES=all" "$toolkit_cfg"
fi
check "live-restore is on" sh -c 'docker info --format "{{.LiveRestoreEnabled}}" | grep -qx true'
if docker network inspect gpum-rentals >/dev/null 2>&1; then
    check "the rentals' egress table is in place" nft list table inet gpum_rentals
    # The host's own sshd, reachable from Docker's default bridge, is not from gpum's network.
    host_ip="$(docker network inspect bridge --format '{{(index .IPAM.Config 0).Gateway}}' 2>/dev/null)"
    if [ -n "$host_ip" ] && ss -ltnH 2>/dev/null | grep -Eq '(0\.0\.0\.0|\*|\[::\]):22 '; then
        probe22() { docker run --rm --network "$1" "$image" bash -c "timeout 3 bash -c '</dev/tcp/$host_ip/22'"; }
        check "the default bridge reaches the host's sshd" probe22 bridge
        check "gpum-rentals does not reach the host" sh -c "! docker run --rm --network gpum-rentals '$image' bash -c \"timeout 3 bash -c '</dev/tcp/$host_ip/22'\""
    else
        printf '%-44s skipped (no sshd on port 22 to aim at)\n' "gpum-rentals does not reach the host"
    fi
else
    printf '%-44s skipped (no gpum-rentals network: the agent makes it at its first rental)\n' "the rentals' egress table"
fi
if [ -x "$installer" ]; then
    # The audit only: --dry-run needs no join code and changes nothing.
    check "gpum-install --dry-run --offline: the GPU check passes" \
        sh -c "'$installer' --dry-run --offline --json | grep -q '\"gpu\"'"
else
    printf '%-44s skipped (%s not found)\n' "gpum-install --dry-run" "$installer"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
