#!/usr/bin/env bash
# Checks the REAL NVIDIA path on a machine with an NVIDIA GPU (no simulation here): the driver's
# NVML, nvidia-smi, the NVIDIA Container Toolkit and Docker's --gpus, then gpum's own audit.
# Run it as root on the GPU machine (vagrant/README.md), from a checkout or with the binaries beside it:
#   sudo tests/real-gpu/check.sh [PATH/TO/gpum-install]
# It prints one line per check and ends with "N passed, N failed"; exit 1 when any failed.
# It changes nothing, except pulling the probe image (GPUM_PROBE_IMAGE, default below) when absent.
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
check "docker run --gpus all nvidia-smi" docker run --rm --gpus all "$image" nvidia-smi
# Rentals (issue 33): the agent runs a rental with these flags (agent/src/docker/rental.rs,
# container_config): the rented GPU by UUID and NVIDIA_VISIBLE_DEVICES set to it over the image's
# and the tenant's `all`, every capability dropped but seven, no-new-privileges, hard limits.
uuid0="$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -n 1)"
gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
rental=(docker run --rm --gpus "\"device=$uuid0\"" -e NVIDIA_VISIBLE_DEVICES=all -e NVIDIA_VISIBLE_DEVICES="$uuid0"
    --cap-drop ALL --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add FOWNER --cap-add SETUID
    --cap-add SETGID --cap-add KILL --cap-add NET_BIND_SERVICE --security-opt no-new-privileges:true
    --pids-limit 4096 --ulimit nofile=16384:16384 --memory 2g --memory-swap 2g --shm-size 64m
    --ipc private --init --restart no "$image")
check "a rental's flags: nvidia-smi works" "${rental[@]}" nvidia-smi
check "a rental sees only its GPU ($gpus on this machine)" \
    sh -c "out=\$(\"\$@\" nvidia-smi -L) && [ \"\$(printf '%s\n' \"\$out\" | grep -c '^GPU ')\" = 1 ] && printf '%s' \"\$out\" | grep -q '$uuid0'" \
    _ "${rental[@]}"
if [ -x "$installer" ]; then
    # The audit only: --dry-run needs no join code and changes nothing.
    check "gpum-install --dry-run --offline: the GPU check passes" \
        sh -c "'$installer' --dry-run --offline --json | grep -q '\"gpu\"'"
else
    printf '%-44s skipped (%s not found)\n' "gpum-install --dry-run" "$installer"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
