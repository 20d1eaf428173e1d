#!/usr/bin/env bash
# Build exllamav3 1.6.5's CUDA extension on the device and hand it back in $OUT, so later calls carry it instead of
# spending ~6 minutes on the JIT build (kernels/README.md, "MoE bench"). Run from the repo root on the device, after
# the carried wheels are installed (peer_wheels.sh; PYTHONPATH=/tmp/site):
#   bash kernels/bench/peer_build.sh [DEST]        DEST defaults to $OUT/peer
# What comes back: DEST/exllamav3_ext.so.<xz|gz>.partN, the stripped .so compressed and cut into <= 15 MiB parts
# ($OUT returns at most 8 files of 16 MiB). Copy them into <repo>/.device/peer/ (ignored by git), carry
# `.device/peer`, and run peer_unpack.sh there. The build also stays in $PEER_BUILD_DIR (/tmp/peer_ext) and in
# .device/peer/ for the rest of this call. Prints one line; exit 1 (and the reason) if the build fails.
set -uo pipefail
dest=${1:-${OUT:?set OUT or pass DEST}/peer}
build=${PEER_BUILD_DIR:-/tmp/peer_ext}
mkdir -p "$dest" "$build" .device/peer
export TORCH_EXTENSIONS_DIR=$build MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export EXL3_EXPANDABLE_SEGMENTS=0
t0=$(date +%s)
log=$build/build.log
# from an empty directory, so exllamav3's find_spec("exllamav3_ext") check sees neither an old .so nor the JIT
# build's own exllamav3_ext/ folder
mkdir -p "$build/cwd"
if ! (cd "$build/cwd" && python3 -c "from exllamav3.ext import exllamav3_ext as e; print(e.__file__)") >"$log" 2>&1; then
    echo "peer build: FAILED after $(($(date +%s) - t0)) s: $(grep -m1 -E 'Error|error' "$log" || tail -n1 "$log")"
    exit 1
fi
so=$(tail -n1 "$log")
case "$so" in
    "$build"/*.so) ;;
    *) echo "peer build: FAILED: exllamav3_ext did not come from the JIT build dir ($so)"; exit 1 ;;
esac
stripped=$build/stripped/exllamav3_ext.so
mkdir -p "$(dirname "$stripped")"
strip --strip-unneeded -o "$stripped" "$so" 2>/dev/null || cp "$so" "$stripped"
cp "$stripped" .device/peer/exllamav3_ext.so
if command -v xz >/dev/null; then z=xz; xz -T0 -6 -c "$stripped" >"$build/exllamav3_ext.so.xz"
else z=gz; gzip -6 -c "$stripped" >"$build/exllamav3_ext.so.gz"; fi
rm -f "$dest"/exllamav3_ext.so.*.part*
split -b 15m -d -a 1 "$build/exllamav3_ext.so.$z" "$dest/exllamav3_ext.so.$z.part"
n=$(ls "$dest"/exllamav3_ext.so.$z.part* | wc -l)
echo "peer build: ok in $(($(date +%s) - t0)) s: $(stat -c %s "$so") B, stripped $(stat -c %s "$stripped") B," \
     "$z $(stat -c %s "$build/exllamav3_ext.so.$z") B in $n part(s) in $dest"
