#!/usr/bin/env bash
# Reassemble the carried exllamav3_ext parts (peer_build.sh's output, copied to <repo>/.device/peer/) into
# .device/peer/exllamav3_ext.so, where peer_exllamav3.load() finds it before exllamav3 would JIT-build.
# Run from the repo root on the device. Prints one line; exit 1 if there are no parts or they do not decompress
# (xz/gzip check their own CRC, so a missing or damaged part cannot yield a silently broken .so).
set -uo pipefail
dir=${1:-.device/peer}
parts=$(ls "$dir"/exllamav3_ext.so.xz.part* 2>/dev/null || ls "$dir"/exllamav3_ext.so.gz.part* 2>/dev/null)
if [ -z "$parts" ]; then echo "peer unpack: no exllamav3_ext.so.*.part* in $dir"; exit 1; fi
case "$parts" in *.xz.part*) dec="xz -dc" ;; *) dec="gzip -dc" ;; esac
tmp=$dir/exllamav3_ext.so.tmp
# split -d -a 1 names parts 0..9, so the shell's sort order is the cut order
if cat $parts | $dec >"$tmp" 2>/dev/null; then
    mv "$tmp" "$dir/exllamav3_ext.so"
    echo "peer unpack: ok: $dir/exllamav3_ext.so ($(stat -c %s "$dir/exllamav3_ext.so") B from $(echo $parts | wc -w) part(s))"
else
    rm -f "$tmp"
    echo "peer unpack: FAILED: the parts in $dir do not decompress (incomplete or damaged)"
    exit 1
fi
