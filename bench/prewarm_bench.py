#!/usr/bin/env python3
"""Cold-read benchmark for `prewarm`: single sequential reader vs 8 workers vs the O_DIRECT ceiling.

Makes N GiB of safetensors shards in a temp directory on the disk under test, then runs the variants
interleaved (so drift in a shared machine's load hits all of them alike), each from a cold cache
(posix_fadvise DONTNEED, verified with mincore), and prints medians and the ratios the prewarm issue
targets: prewarm >= 1.5x the single reader, >= 0.9x the disk ceiling.

    python bench/prewarm_bench.py                       # 4 GiB in 8 shards, 3 rounds
    python bench/prewarm_bench.py --rounds 5 --extra   # also pread, threads vs processes, 1/4/16 workers
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prewarm import evict, measure_disk, residency, warm  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20


def write_shard(path: Path, nbytes: int) -> None:
    """A valid safetensors file holding one U8 tensor of random bytes (incompressible)."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    block = os.urandom(64 * MiB)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)))
        fh.write(header)
        left = nbytes
        while left:
            n = min(left, len(block))
            fh.write(block[:n] if n < len(block) else block)
            left -= n
            block = block[1:] + block[:1]  # shift so no two 64 MiB runs are identical
        fh.flush()
        os.fsync(fh.fileno())


def single_reader(files: list[Path]) -> int:
    """What a serial loader does: one file after another, one buffered read stream."""
    buf = bytearray(16 * MiB)
    total = 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                total += n
    return total


def _proc_read(args: tuple[str, list[tuple[int, int]]]) -> int:
    path, ranges = args
    buf = mmap.mmap(-1, 16 * MiB)
    fd = os.open(path, os.O_RDONLY)
    total = 0
    try:
        for off, length in ranges:
            end = off + length
            while off < end:
                n = os.preadv(fd, [memoryview(buf)[: min(16 * MiB, end - off)]], off)
                if n <= 0:
                    break
                off += n
                total += n
    finally:
        os.close(fd)
    return total


def processes(files: list[Path], workers: int = 8) -> int:
    """The alternative design: worker processes instead of threads (same 64 MiB work items)."""
    jobs = []
    for f in files:
        size = f.stat().st_size
        for off in range(0, size, 64 * MiB):
            jobs.append((str(f), [(off, min(64 * MiB, size - off))]))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(_proc_read, jobs))


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (the process-pool variant)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=4.0, help="total shard size [4]")
    ap.add_argument("--files", type=int, default=8, help="number of shards [8]")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; medians are reported [3]")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--dir", default=None, help="where to make the shards [a temp dir under /var/tmp]")
    ap.add_argument("--keep", action="store_true", help="keep the shards (and reuse them with --dir)")
    ap.add_argument("--extra", action="store_true", help="also time pread, processes, 1, 4 and 16 workers")
    ap.add_argument("--json", default=None, help="write all timings to this JSON file")
    args = ap.parse_args()

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="prewarm-bench-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    per_file = int(args.gib * GiB) // args.files
    need = per_file * args.files
    free = shutil.disk_usage(base).free
    if free < need + 2 * GiB:
        print(
            f"not enough space in {base}: need {need / GiB:.1f} GiB + 2 GiB, have {free / GiB:.1f}",
            file=sys.stderr,
        )
        return 2
    files = [base / f"model-{i + 1:05d}-of-{args.files:05d}.safetensors" for i in range(args.files)]
    try:
        t = time.perf_counter()
        for f in files:
            if not (f.exists() and f.stat().st_size > per_file):
                write_shard(f, per_file)
        print(
            f"shards: {args.files} x {per_file / GiB:.2f} GiB in {base} ({time.perf_counter() - t:.1f} s to make)"
        )
        total = sum(f.stat().st_size for f in files)

        variants: dict[str, Callable[[], object]] = {
            "single reader": lambda: single_reader(files),
            f"prewarm {args.workers} workers": lambda: warm(
                files, workers=args.workers, residency_check=False
            ),
            f"disk ceiling (O_DIRECT, {args.workers} workers)": lambda: measure_disk(
                files, workers=args.workers
            ),
        }
        if args.extra:
            variants[f"prewarm pread {args.workers} workers"] = lambda: warm(
                files, workers=args.workers, method="pread", residency_check=False
            )
            variants[f"processes pread {args.workers}"] = lambda: processes(files, args.workers)
            variants["prewarm 1 worker"] = lambda: warm(files, workers=1, residency_check=False)
            variants["prewarm 4 workers"] = lambda: warm(files, workers=4, residency_check=False)
            variants["prewarm 16 workers"] = lambda: warm(files, workers=16, residency_check=False)
        times: dict[str, list[float]] = {name: [] for name in variants}
        cpus: dict[str, list[float]] = {name: [] for name in variants}
        print(f"machine: {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}")
        for rnd in range(args.rounds):
            for name, fn in variants.items():
                ev = evict(files)
                if ev.residency_after > 0.01:
                    print(
                        f"warning: {100 * ev.residency_after:.1f} % still cached before {name}",
                        file=sys.stderr,
                    )
                c0 = _cpu_seconds()
                t = time.perf_counter()
                fn()
                dt = time.perf_counter() - t
                cpu = _cpu_seconds() - c0
                times[name].append(dt)
                cpus[name].append(cpu)
                cached = residency(files)
                print(
                    f"round {rnd + 1} {name:<34} {dt:7.2f} s {total / GiB / dt:6.2f} GiB/s  "
                    f"cpu {cpu / (total / GiB):5.2f} s/GiB  cached after {100 * cached:5.1f} %",
                    flush=True,
                )
        print()
        med = {name: statistics.median(v) for name, v in times.items()}
        for name, m in med.items():
            cpu = statistics.median(cpus[name]) / (total / GiB)
            runs = ", ".join(f"{x:.2f}" for x in times[name])
            print(
                f"median {name:<34} {m:7.2f} s {total / GiB / m:6.2f} GiB/s  cpu {cpu:5.2f} s/GiB  (runs: {runs})"
            )
        print(f"load average at end {os.getloadavg()[0]:.2f}")
        single, pre, disk = (med[n] for n in list(variants)[:3])
        vs_single, vs_disk = single / pre, disk / pre
        print(
            f"\nprewarm vs single reader: {vs_single:.2f}x (target >= 1.5x) {'PASS' if vs_single >= 1.5 else 'MISS'}"
        )
        print(
            f"prewarm vs disk ceiling:  {vs_disk:.2f}x (target >= 0.9x) {'PASS' if vs_disk >= 0.9 else 'MISS'}"
        )
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {"total_bytes": total, "times": times, "cpu_seconds": cpus, "median": med}, indent=2
                )
            )
        return 0
    finally:
        evict(files) if all(f.exists() for f in files) else None
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
