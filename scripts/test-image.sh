#!/usr/bin/env bash
# Build the local image the docker runtime's end-to-end tests run in (`make test-image`).
#
#   scripts/test-image.sh [IMAGE]        (default sparkctl-test:cpu)
#
# No container registry is reachable from dev/CI machines, so the image is a Debian bookworm minbase
# root filesystem made with debootstrap (from the Debian mirror, a package registry) and imported with
# `docker import`. It carries only the shared libraries the host Python and the venv's compiled
# modules (torch, vLLM's _C) link against; Python itself and the venv are bind-mounted read-only at
# their host paths when a container runs, so the image stays small and never goes stale.
#
# The rootfs tarball is cached under $CACHE and the image is labelled with a hash of its package
# list: both are rebuilt only when missing or when that list changes. Exits 0 with a reason recorded
# in $CACHE/test-image.status when it cannot build here (no engine, not root, no debootstrap, no
# Debian mirror), so `make test` goes on and the docker tests skip (SPARKCTL_REQUIRE_DOCKER=1 makes
# that an error); an import the engine refuses is an error unless SPARKCTL_REQUIRE_DOCKER=0.
set -uo pipefail

IMAGE="${1:-sparkctl-test:cpu}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sparkctl/docker"
STATUS="$CACHE/test-image.status"
SUITE=bookworm
MIRROR="${SPARKCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# What `ldd` says the host Python (pyenv 3.11), its stdlib extensions, torch and vLLM's _C need, plus
# CA certificates. Tk/X11 (only tkinter uses them) are left out on purpose.
PACKAGES=(
    ca-certificates libbz2-1.0 libcrypt1 libexpat1 libffi8 libgcc-s1 libgomp1 libgssapi-krb5-2
    liblzma5 libncursesw6 libnsl2 libnuma1 libreadline8 libsqlite3-0 libssl3 libstdc++6 libtinfo6
    libtirpc3 libuuid1 zlib1g
)
mkdir -p "$CACHE"

NAME=test-image
# shellcheck source=lib/outcome.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/outcome.sh"

include="$(IFS=,; echo "${PACKAGES[*]}")"
key="$(printf '%s|%s|%s' "$SUITE" "$(uname -m)" "$include" | sha256sum | cut -c1-16)"
rootfs_tar="$CACHE/test-rootfs-$SUITE-$key.tar"

command -v docker >/dev/null 2>&1 || unavailable "no docker client on PATH (run \`make docker-engine\`)"
timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
    unavailable "no Docker engine answering (run \`make docker-engine\` as root)"

have="$(docker image inspect --format '{{ index .Config.Labels "io.sparkctl.test-image.key" }}' "$IMAGE" 2>/dev/null)"
if [[ "$have" == "$key" ]]; then
    say "$IMAGE is up to date (key $key)"
    record ready "$IMAGE"
    exit 0
fi

if [[ ! -s "$rootfs_tar" ]]; then
    [[ $(id -u) -eq 0 ]] || unavailable "building the rootfs needs root (debootstrap); run \`sudo make test-image\`"
    command -v debootstrap >/dev/null 2>&1 || unavailable "debootstrap not installed (run \`make docker-engine\` as root)"
    work="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    say "debootstrap $SUITE minbase + ${#PACKAGES[@]} libraries (log: $CACHE/debootstrap.log)"
    start=$SECONDS
    if ! debootstrap --variant=minbase --include="$include" "$SUITE" "$work/root" "$MIRROR" \
        >"$CACHE/debootstrap.log" 2>&1; then
        tail -n 10 "$CACHE/debootstrap.log" >&2
        unavailable "debootstrap failed (see $CACHE/debootstrap.log)"
    fi
    # The package lists and caches are dead weight inside a test image.
    rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
    tar -C "$work/root" -cf "$rootfs_tar.tmp" . && mv -f "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$work"
    trap - EXIT
    say "rootfs built in $((SECONDS - start))s: $rootfs_tar ($(du -h "$rootfs_tar" | cut -f1))"
fi

say "importing $rootfs_tar as $IMAGE"
if ! docker import \
    --change "LABEL io.sparkctl.test-image.key=$key" \
    --change "LABEL org.opencontainers.image.description=\"sparkctl docker e2e test image (Debian $SUITE minbase)\"" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    "$rootfs_tar" "$IMAGE" >/dev/null; then
    broken "docker import of $rootfs_tar failed"
fi
say "$IMAGE ready (key $key)"
record ready "$IMAGE"
