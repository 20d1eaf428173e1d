#!/usr/bin/env bash
# The real Spark image build on CI and dev machines (`make image-ci`, a step of `make test`): a local
# Debian base (scripts/spark-base.sh) + the PyPI wheels, the kernels compiled for sm_121 by nvcc inside,
# docker/smoke.py run by the build (docker/README.md, "The full build in CI").
#
#   scripts/image-ci.sh [BASE]       (default sparkctl-base:bookworm-py311)
#   SPARKCTL="python -m sparkctl"    the sparkctl to run (default: sparkctl on PATH)
#
# The gate is the image's content-hash tag, not a git diff: `sparkctl build --check` says whether an image
# exists for exactly these inputs (Dockerfile, kernels/, sparkctl/, pins, base id), so a fresh clone whose
# HEAD is origin/main still builds when this engine has no such image, and an unchanged tree costs
# seconds. What is rebuilt then is what changed (Docker's layer cache): a kernel edit the kernel layer,
# a Python edit the last layer, a pin or base change the multi-GB wheel layer.
#
# No engine, not root, no debootstrap: skipped with that reason (exit 0) unless SPARKCTL_REQUIRE_DOCKER=1.
# A base or image build that should work here and fails: exit 1 (SPARKCTL_REQUIRE_DOCKER=0 skips instead).
set -uo pipefail

BASE="${1:-sparkctl-base:bookworm-py311}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sparkctl/docker"
STATUS="$CACHE/image-ci.status"
read -ra SPARKCTL <<<"${SPARKCTL:-sparkctl}"
mkdir -p "$CACHE"

NAME=image-ci
# shellcheck source=lib/outcome.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/outcome.sh"

"$(dirname "${BASH_SOURCE[0]}")/spark-base.sh" "$BASE" || broken "the local base $BASE could not be made (above)"
base_state="$(cut -f1 "$CACHE/spark-base.status" 2>/dev/null)"
if [[ "$base_state" != ready ]]; then
    unavailable "no local base image: $(cut -f2 "$CACHE/spark-base.status" 2>/dev/null || echo 'spark-base.sh recorded nothing')"
fi

prune_stale() { # sparkctl-built images on $BASE's earlier ids can never be reused (the base id is in their
    # tag) and each holds a 10 GB wheel layer: they go (and the old base with them, once nothing uses it)
    local want id tags
    want="$(docker image inspect --format '{{.Id}}' "$BASE" 2>/dev/null)" || return 0
    for id in $(docker images --quiet --no-trunc --filter label=io.sparkctl.inputs-hash \
        --filter "label=io.sparkctl.base-image=$BASE" | sort -u); do
        [[ "$(docker image inspect --format '{{ index .Config.Labels "io.sparkctl.base-id" }}' "$id")" == "$want" ]] && continue
        read -ra tags <<<"$(docker image inspect --format '{{join .RepoTags " "}}' "$id")"
        # by tag, never forced: an image a container still uses stays
        if docker image rm "${tags[@]:-$id}" >/dev/null 2>&1; then
            say "removed ${tags[*]:-$id} (built on an earlier $BASE)"
        fi
    done
}

start=$SECONDS
out="$("${SPARKCTL[@]}" build --base "$BASE" --check 2>&1)"
rc=$?
last="${out##*$'\n'}"
tag="${last%%: *}" # "<tag>: up to date" / "<tag>: not built yet (...)"
case $rc in
0)
    say "skipped: $last (checked in $((SECONDS - start))s)"
    # the no-op build points the recipe's name back at this image (an earlier run may have moved it)
    "${SPARKCTL[@]}" build --base "$BASE" >/dev/null 2>&1 || true
    record ready "$tag"
    prune_stale
    exit 0
    ;;
1) say "building: $last" ;;
*)
    echo "$out" >&2
    broken "\`sparkctl build --base $BASE --check\` failed (exit $rc)"
    ;;
esac
"${SPARKCTL[@]}" build --base "$BASE" || broken "\`sparkctl build --base $BASE\` failed (above)"
say "built $tag in $((SECONDS - start))s"
record ready "$tag"
prune_stale
