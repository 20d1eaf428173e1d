#!/usr/bin/env bash
# Unpack the slimmed vLLM that engine_pack.py made (carried as .device/engine) into a site directory on the GPU machine.
# Run from the repo root there; then `export PYTHONPATH=SITE:$PWD/kernels` and run engine_check.py. Prints one line;
# exit 1 when the archive is missing or damaged (xz checks its own CRC, so a cut archive cannot unpack silently).
set -uo pipefail
site=${1:-/tmp/site}
archive=${2:-.device/engine/site.tar.xz}
if [ ! -f "$archive" ]; then echo "engine unpack: no $archive (run kernels/bench/engine_pack.py here and carry .device/engine)"; exit 1; fi
mkdir -p "$site"
t0=$(date +%s)
if tar -xJf "$archive" -C "$site"; then
    echo "engine unpack: ok: $site ($(du -sm "$site" | cut -f1) MB) in $(( $(date +%s) - t0 )) s"
else
    echo "engine unpack: FAILED: $archive does not unpack"; exit 1
fi
