#!/usr/bin/env bash
# Make a local base image for the real image build (`make image-ci`): Debian bookworm minbase with
# python3 (3.11), pip, g++ and make, imported with `docker import`. No container registry is reachable
# from dev/CI machines, so the `nvidia/cuda` default base cannot be pulled there; with this base the
# Dockerfile installs vLLM, torch, FlashInfer and nvcc from PyPI wheels itself (docker/README.md).
#
#   scripts/spark-base.sh [IMAGE]        (default sparkctl-base:bookworm-py311)
#
# The host's CA bundle is copied in, so pip inside the build trusts the same TLS proxy the host does.
# Cached: the rootfs tar under $CACHE, and the image is labelled with a hash of its package list and CA
# bundle; rebuilt only when either changes.
set -uo pipefail

IMAGE="${1:-sparkctl-base:bookworm-py311}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sparkctl/docker"
STATUS="$CACHE/spark-base.status"
SUITE=bookworm
MIRROR="${SPARKCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=(python3 python3-pip python3-dev python3-venv g++ make ca-certificates libgomp1 libnuma1)
CA=/etc/ssl/certs/ca-certificates.crt
mkdir -p "$CACHE"

NAME=spark-base
# shellcheck source=lib/outcome.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/outcome.sh"

include="$(IFS=,; echo "${PACKAGES[*]}")"
ca_sum="$( [[ -r $CA ]] && sha256sum "$CA" | cut -c1-16 || echo none)"
key="$(printf '%s|%s|%s|%s' "$SUITE" "$(uname -m)" "$include" "$ca_sum" | sha256sum | cut -c1-16)"
rootfs_tar="$CACHE/spark-base-$SUITE-$key.tar"

timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
    unavailable "no Docker engine answering (run \`make docker-engine\` as root)"
have="$(docker image inspect --format '{{ index .Config.Labels "io.sparkctl.spark-base.key" }}' "$IMAGE" 2>/dev/null)"
if [[ "$have" == "$key" ]]; then
    say "$IMAGE is up to date (key $key)"
    record ready "$IMAGE"
    exit 0
fi
if [[ ! -s "$rootfs_tar" ]]; then
    [[ $(id -u) -eq 0 ]] || unavailable "building the rootfs needs root (debootstrap)"
    command -v debootstrap >/dev/null 2>&1 || unavailable "debootstrap not installed (make docker-engine)"
    work="$(mktemp -d "$CACHE/spark-base.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    say "debootstrap $SUITE minbase + ${#PACKAGES[@]} packages (log: $CACHE/spark-base.log)"
    start=$SECONDS
    if ! debootstrap --variant=minbase --include="$include" "$SUITE" "$work/root" "$MIRROR" \
        >"$CACHE/spark-base.log" 2>&1; then
        tail -n 10 "$CACHE/spark-base.log" >&2
        broken "debootstrap failed (see $CACHE/spark-base.log)"
    fi
    [[ -r $CA ]] && cp "$CA" "$work/root/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
    tar -C "$work/root" -cf "$rootfs_tar.tmp" . && mv -f "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$work"
    trap - EXIT
    say "rootfs built in $((SECONDS - start))s"
fi
if ! docker import \
    --change "LABEL io.sparkctl.spark-base.key=$key" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    "$rootfs_tar" "$IMAGE" >/dev/null; then
    broken "docker import of $rootfs_tar failed"
fi
say "$IMAGE ready (key $key)"
record ready "$IMAGE"
