#!/usr/bin/env bash
# Regenerate docker/compose.yml with `sparkctl render glm-5.3-flash --format compose`
# (tests/docker/test_docker_compose.py checks the checked-in file is in sync). The renderer writes this
# machine's home directory into bind-mount sources; it becomes ${HOME}, which compose interpolates, so
# the checked-in file works for whoever runs it on the Spark. Container paths are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE="${1:-glm-5.3-flash}"
OUT="docker/compose.yml"
BIN="${VENV:-.venv}/bin"
tmp="$(mktemp "$OUT.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
"$BIN/sparkctl" render "$RECIPE" --format compose | HOME_DIR="$HOME" "$BIN/python" -c '
import os, re, sys
home = re.escape(os.environ["HOME_DIR"].rstrip("/"))
for line in sys.stdin:
    sys.stdout.write(re.sub(r"^(\s*source: )" + home + r"(?=/|$)", r"\1${HOME}", line))
' >"$tmp"
mv -f "$tmp" "$OUT"
trap - EXIT
echo "wrote $OUT"
