#!/usr/bin/env bash
# Regenerate docker/compose.yml with `sparkctl render glm-5.3-flash --format compose`
# (tests/docker/test_docker_compose.py checks the checked-in file is in sync). The renderer writes this
# machine's home directory into bind-mount sources; it becomes ${HOME}, which compose interpolates, so
# the checked-in file works for whoever runs it on the Spark. Container paths are left alone. A prepared
# recipe (model.prepare) needs `sparkctl prepare RECIPE` first: the overlay it mounts is made there.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE="${1:-glm-5.3-flash}"
OUT="docker/compose.yml"
BIN="${VENV:-.venv}/bin"
tmp="$(mktemp "$OUT.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
# Rendered under a stand-in home, so host paths cannot be mistaken for container paths such as /root/...:
# a target under it is a host directory mounted at its own path (where a prepare overlay's links point).
RENDER_HOME=/home/sparkctl-render
env -u SPARKCTL_CACHE_DIR -u XDG_CACHE_HOME HOME="$RENDER_HOME" "$BIN/sparkctl" render "$RECIPE" --format compose |
  HOME_DIR="$RENDER_HOME" "$BIN/python" -c '
import os, re, sys
home = re.escape(os.environ["HOME_DIR"])
for line in sys.stdin:
    sys.stdout.write(re.sub(r"^(\s*(?:source|target): )" + home + r"(?=/|$)", r"\1${HOME}", line))
' >"$tmp"
mv -f "$tmp" "$OUT"
trap - EXIT
echo "wrote $OUT"
