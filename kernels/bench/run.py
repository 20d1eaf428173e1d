"""EXL3 kernel harness: build, check every kernel against the reference decoder, then time it.

One command for the GPU machine (see kernels/PERF.md for the exact invocations and the results):

    python kernels/bench/run.py --vectors .device/vectors_gemv.safetensors --out $OUT

Steps, each printed and also written to ``<out>/bench.json``:
1. build the torch extension (``sparkctl_exl3.cuda``) with the A/B paths (``SPARKCTL_EXL3_AB_PATHS=1``, its own
   build folder) and report how long it took;
2. correctness, per registered kernel: the shared vectors (exllamav3's own y = x.W, and our reference decoder),
   fresh random shapes for every rate and codebook and 1..8 rows (plus >8 rows through grouping), outputs taken
   from memory poisoned with NaN, forced split-K variants, repeated calls (determinism), and CUDA-graph replay;
3. timing with CUDA graphs (each graph holds many calls over rotated weight sets larger than L2, so the numbers
   are HBM numbers), against the same-shape dense fp16 ``torch.matmul`` and against the memory-bandwidth floor
   of the bytes the kernel must read, printing a table.

Later kernels plug in by adding a :class:`KernelSpec` to :data:`KERNELS`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compiled_rates  # noqa: E402
from sparkctl_exl3 import reference  # noqa: E402

CODEBOOKS = reference.CODEBOOKS  # ("3inst", "mcg", "mul1"), index = codebook id
# twice the bits per weight, as the kernels are compiled (csrc/exl3_common.cuh, EXL3_RATES); odd = mul1 only
RATES_K2 = compiled_rates.rates_k2()
HBM_PEAK_GBS = 4800.0  # H200 datasheet; the measured copy bandwidth is reported next to it
REL_TOL = 1e-3  # SPEC/VECTORS: y within 1e-3 relative error
# exllamav3 computed these y1 with its int8-activation GEMV (SPEC 5, exl3_gemv_int8): they differ from the exact
# x1.W by about 6e-3, so against them the bar is 1e-2 (and 1e-3 against our reference, as everywhere).
INT8_GEMV_Y1 = {"r.mul1.K2", "r.mul1.K4", "q.mul1.K4.big"}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.double(), b.double()
    if not torch.isfinite(a64).all():
        return math.inf
    return float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))


def min_ksplit(in_f: int, out_f: int, k2: int, codebook: str, rows: int) -> int:
    """Fewest input splits the kernel accepts for this call, as its planner says (the kernel's one rule)."""
    from sparkctl_exl3 import cuda

    return cuda.gemv_ksplit_range(rows, in_f, out_f, k2, CODEBOOKS.index(codebook))[0]


def k2_label(k2: int) -> str:
    return str(k2 // 2) if k2 % 2 == 0 else f"{k2 / 2:.1f}"


def random_layer(
    in_f: int, out_f: int, k2: int, gen: torch.Generator, device: str
) -> tuple[torch.Tensor, ...]:
    """A random EXL3 layer: any int16 bit pattern is a valid trellis (SPEC 2.2); suh/svh of realistic size."""
    last = 8 * k2
    trellis = torch.randint(-32768, 32768, (in_f // 16, out_f // 16, last), generator=gen, dtype=torch.int32)
    trellis = trellis.to(torch.int16).to(device)
    suh = (torch.randn(in_f, generator=gen) * 0.05).half().to(device)
    svh = (torch.randn(out_f, generator=gen) * 0.05).half().to(device)
    return trellis, suh, svh


def poisoned_call(
    fn: Callable[[], torch.Tensor], rows: int, cols: int, device: str
) -> tuple[torch.Tensor, bool]:
    """Run fn after leaving a NaN-filled block of the output's size in torch's cache, so an unwritten element
    shows up as NaN; returns (output, whether the output really landed in the poisoned block)."""
    poison = torch.full((rows, cols), float("nan"), dtype=torch.float16, device=device)
    ptr = poison.data_ptr()
    del poison
    y = fn()
    return y, y.data_ptr() == ptr


# ------------------------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    kernel: str
    case: str
    err: float
    tol: float
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.err <= self.tol


@dataclass
class TimeResult:
    kernel: str
    shape: str
    bits: str
    codebook: str
    rows: int
    ksplit: int
    us: float
    dense_us: float
    floor_us: float
    bytes_read: int
    extra: dict = field(default_factory=dict)


@dataclass
class KernelSpec:
    """One kernel under test: how to check it and how to time it."""

    name: str
    check: Callable[[argparse.Namespace], Iterator[CheckResult]]
    bench: Callable[[argparse.Namespace], Iterator[TimeResult]]


# ------------------------------------------------------------------------------------------------------------
# GEMV
# ------------------------------------------------------------------------------------------------------------


def _gemv_check(args: argparse.Namespace) -> Iterator[CheckResult]:
    from sparkctl_exl3 import cuda

    dev = "cuda"
    # 1. shared vectors: exllamav3's y and our reference, every layer, every x batch
    if args.vectors and Path(args.vectors).exists():
        from safetensors.torch import load_file

        vec = load_file(args.vectors)
        tags = sorted({k.rsplit(".", 1)[0] for k in vec if k.endswith(".trellis")})
        for tag in tags:
            layer = {k.rsplit(".", 1)[1]: v for k, v in vec.items() if k.rsplit(".", 1)[0] == tag}
            cb = reference.codebook_of(layer)
            cb_id = CODEBOOKS.index(cb)
            trellis, suh, svh = (layer[n].to(dev) for n in ("trellis", "suh", "svh"))
            for xname in sorted(n for n in layer if n.startswith("x")):
                x = layer[xname].to(dev)
                y_ref_exl = layer["y" + xname[1:]].to(dev)
                y, landed = poisoned_call(
                    partial(cuda.gemv, x, trellis, suh, svh, cb_id), x.shape[0], svh.numel(), dev
                )
                y_ref = reference.matmul(x, trellis, suh, svh, cb)
                note = "" if landed else "(output not in poisoned block)"
                tol = 1e-2 if (xname == "x1" and tag in INT8_GEMV_Y1) else REL_TOL
                yield CheckResult(
                    "gemv", f"vectors {tag} {xname} vs exllamav3", rel_err(y, y_ref_exl), tol, note
                )
                yield CheckResult(
                    "gemv", f"vectors {tag} {xname} vs reference", rel_err(y, y_ref), REL_TOL, note
                )
    else:
        yield CheckResult("gemv", f"vectors file missing: {args.vectors}", math.inf, REL_TOL)

    # 2. fresh random layers: every rate x codebook, rows 1..8, assorted shapes, forced split-K
    gen = torch.Generator().manual_seed(args.seed)
    shapes = [(128, 128), (256, 384), (640, 256), (1024, 1152), (2176, 512), (4096, 1024)]
    for k2 in RATES_K2:
        for cb in compiled_rates.codebooks(k2):
            cb_id = CODEBOOKS.index(cb)
            for si, (in_f, out_f) in enumerate(shapes):
                trellis, suh, svh = random_layer(in_f, out_f, k2, gen, dev)
                w = reference.weight(trellis, suh, svh, cb).float()
                rows_list = [1 + (si + k2 + cb_id) % 8, 8] if si < len(shapes) - 1 else list(range(1, 9))
                for rows in rows_list:
                    x = (torch.randn(rows, in_f, generator=gen)).half().to(dev)
                    y_ref = x.float() @ w
                    n_k = in_f // 128
                    for ks in sorted({0, 1, min(n_k, 3), n_k}):
                        if ks and ks < min_ksplit(in_f, out_f, k2, cb, rows):
                            continue
                        y, landed = poisoned_call(
                            partial(cuda.gemv, x, trellis, suh, svh, cb_id, ksplit=ks), rows, out_f, dev
                        )
                        case = (
                            f"random {in_f}x{out_f} K={k2_label(k2)} {cb} rows={rows} ksplit={ks or 'auto'}"
                        )
                        yield CheckResult(
                            "gemv", case, rel_err(y, y_ref), REL_TOL, "" if landed else "(not poisoned)"
                        )
                        if ks == 0:
                            y2 = cuda.gemv(x, trellis, suh, svh, cb_id)
                            same = torch.equal(y, y2)
                            yield CheckResult(
                                "gemv", case + " repeat bit-identical", 0.0 if same else math.inf, 0.0
                            )

    # 2b. both input-transform paths for every row count: fused (per block in the fp16 kernel, per warp in the
    # integer kernel) and the separate x' kernel
    for min_rows in (1, 99):
        with cuda.tuned(xprep_min_rows=min_rows):
            for k2, cb in ((4, "mul1"), (6, "3inst"), (5, "mul1")):
                trellis, suh, svh = random_layer(2048, 640, k2, gen, dev)
                w = reference.weight(trellis, suh, svh, cb).float()
                for rows in range(1, 9):
                    x = torch.randn(rows, 2048, generator=gen).half().to(dev)
                    y, landed = poisoned_call(
                        partial(cuda.gemv, x, trellis, suh, svh, CODEBOOKS.index(cb)), rows, 640, dev
                    )
                    # mul1 at 5-8 rows always prepares x' in the GEMV (fp16 x', no x' kernel path)
                    separate = min_rows == 1 and not (cb == "mul1" and rows > 4)
                    path = "separate" if separate else "fused"
                    case = f"x' {path} 2048x640 K={k2_label(k2)} {cb} rows={rows}"
                    yield CheckResult(
                        "gemv", case, rel_err(y, x.float() @ w), REL_TOL, "" if landed else "(not poisoned)"
                    )

    # 2b'. whole chunks per warp (chunk_runs in exl3_gemv_i8.cuh): 28 input chunks in one block, 12 warps taking 2 and 4
    # taking 1, in every row class of the integer kernel
    trellis, suh, svh = random_layer(3584, 512, 4, gen, dev)
    w = reference.weight(trellis, suh, svh, "mul1").float()
    for rows in (1, 2, 3, 5, 8):
        x = torch.randn(rows, 3584, generator=gen).half().to(dev)
        y = cuda.gemv(x, trellis, suh, svh, 2, ksplit=1)
        case = f"whole-chunk warp runs 3584x512 K=2 mul1 rows={rows} ksplit=1"
        yield CheckResult("gemv", case, rel_err(y, x.float() @ w), REL_TOL)

    # 2c'. mul1 through the fp16 kernel too (the integer kernel is the default; the tuning's mul1_fp16)
    with cuda.tuned(mul1_fp16=1):
        for k2 in (4, 8, 5):
            trellis, suh, svh = random_layer(1024, 640, k2, gen, dev)
            w = reference.weight(trellis, suh, svh, "mul1").float()
            for rows in (1, 5, 8):
                x = torch.randn(rows, 1024, generator=gen).half().to(dev)
                y = cuda.gemv(x, trellis, suh, svh, 2)
                case = f"mul1 fp16 kernel 1024x640 K={k2_label(k2)} rows={rows}"
                yield CheckResult("gemv", case, rel_err(y, x.float() @ w), REL_TOL)

    # 2c''. activations with outliers: the integer kernel carries x' as 16-bit integers scaled by the largest |x'| of
    # what one int32 sum covers, so one huge channel must not drown the others (error against the float64 product)
    for k2, cb in ((4, "mul1"), (8, "mul1"), (4, "3inst")):
        trellis, suh, svh = random_layer(4096, 512, k2, gen, dev)
        w = reference.weight(trellis, suh, svh, cb).double()
        for rows in (1, 6):
            x = torch.randn(rows, 4096, generator=gen) * torch.exp(torch.randn(rows, 4096, generator=gen))
            x[:, 7] *= 300.0
            x = x.half()
            y = cuda.gemv(x.to(dev), trellis, suh, svh, CODEBOOKS.index(cb))
            case = f"outlier activations 4096x512 K={k2_label(k2)} {cb} rows={rows}"
            yield CheckResult("gemv", case, rel_err(y, x.double().to(dev) @ w), REL_TOL)

    # 2c. the GB10's 99 KiB of shared memory per block, with the costliest layouts: x' fused per block for 8 rows
    # (fp16 kernel), per warp for 8 and 4 rows (integer kernel, two and one column groups), and one row at K=8 (the
    # integer kernel's deepest ring)
    with cuda.tuned(smem_limit=99 * 1024, xprep_min_rows=99):
        # 4096x16384: 128 column chunks, so one row takes no split (32 input chunks per block, the largest x')
        for out_f, rows_list in ((512, (8,)), (16384, (8, 4, 1))):
            trellis, suh, svh = random_layer(4096, out_f, 16, gen, dev)
            w = reference.weight(trellis, suh, svh, "mul1").float()
            for rows in rows_list:
                for i8_max in (4, 8) if rows == 8 else (8,):
                    with cuda.tuned(i8_max_rows=i8_max):
                        x = torch.randn(rows, 4096, generator=gen).half().to(dev)
                        ks = cuda.gemv_ksplit(rows, 4096, out_f, 16, 2)
                        y = cuda.gemv(x, trellis, suh, svh, 2)
                    kernel = "integer" if rows <= i8_max else "fp16"
                    case = f"99 KiB shared-memory cap, {rows} rows, {kernel} kernel, 4096x{out_f} K=8 mul1 (ksplit {ks})"
                    yield CheckResult("gemv", case, rel_err(y, x.float() @ w), REL_TOL)
            del w

    # 3. grouping (>8 rows), the torch op, CUDA graph replay
    trellis, suh, svh = random_layer(1024, 2048, 8, gen, dev)
    w = reference.weight(trellis, suh, svh, "mul1").float()
    for rows in (9, 17, 33):
        x = torch.randn(rows, 1024, generator=gen).half().to(dev)
        y = cuda.gemv(x, trellis, suh, svh, 2)
        yield CheckResult(
            "gemv", f"grouped rows={rows} 1024x2048 K=4 mul1", rel_err(y, x.float() @ w), REL_TOL
        )
    try:
        from sparkctl_exl3 import ops

        x = torch.randn(3, 1024, generator=gen).half().to(dev)
        y = torch.ops.sparkctl_exl3.exl3_gemm(x, trellis, suh, svh, 2)
        used = ops.cuda_kernel() is not None
        yield CheckResult(
            "gemv", f"torch op exl3_gemm (kernel used: {used})", rel_err(y, x.float() @ w), REL_TOL
        )
    except ImportError as exc:
        yield CheckResult("gemv", f"torch op unavailable: {exc}", 0.0, REL_TOL, "skipped")
    x = torch.randn(2, 1024, generator=gen).half().to(dev)
    static_x = x.clone()
    cuda.gemv(static_x, trellis, suh, svh, 2)  # warm-up outside capture (allocator, counters)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = cuda.gemv(static_x, trellis, suh, svh, 2)
    for _ in range(3):
        fresh = torch.randn(2, 1024, generator=gen).half().to(dev)
        static_x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        yield CheckResult(
            "gemv", "CUDA graph replay 2x1024x2048 K=4 mul1", rel_err(static_y, fresh.float() @ w), REL_TOL
        )

    # 4. errors surface as Python exceptions with a message
    for label, call in [
        ("fp32 x", lambda: cuda.gemv(x.float(), trellis, suh, svh, 2)),
        ("bad codebook", lambda: cuda.gemv(x, trellis, suh, svh, 5)),
        ("wrong I", lambda: cuda.gemv(x[:, :512].contiguous(), trellis, suh, svh, 2)),
    ]:
        try:
            call()
            yield CheckResult("gemv", f"error case '{label}' did not raise", math.inf, 0.0)
        except (RuntimeError, ValueError) as exc:
            yield CheckResult(
                "gemv", f"error case '{label}' raised: {str(exc).splitlines()[0][:90]}", 0.0, 0.0
            )


def _graph_time_us(
    make_call: Callable[[int], Callable[[], object]], n_sets: int, calls: int, reps: int, warm_ms: float = 0.0
) -> float:
    """Median time of one call, from CUDA-graph replays of `calls` calls cycling over `n_sets` input sets.

    `warm_ms` of replays come first (dense and EXL3 alike), for a card that ramps its SM clock slowly: a serving GPU
    is under sustained load. The H200 does not ramp and the warm-up changes nothing there (kernels/PERF.md run 85),
    hence the default of 0.
    """
    fns = [make_call(i % n_sets) for i in range(calls)]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[: 2 * n_sets]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):  # same stream as the warm-up: the kernels' counters already exist
        for f in fns:
            f()
    graph.replay()
    torch.cuda.synchronize()
    until = time.perf_counter() + warm_ms / 1000.0
    while time.perf_counter() < until:
        for _ in range(8):
            graph.replay()
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0 / calls)
    del graph
    return statistics.median(times)


def _gemv_bench(args: argparse.Namespace) -> Iterator[TimeResult]:
    from sparkctl_exl3 import cuda

    dev = "cuda"
    gen = torch.Generator().manual_seed(args.seed + 1)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    shapes = [(4096, 14336), (14336, 4096)] + ([(4096, 4096), (8192, 28672)] if args.full else [])
    rates = [int(2 * float(k)) for k in args.bits.split(",")]
    cbs = args.codebooks.split(",")
    rows_list = [int(r) for r in args.rows.split(",")]
    dense_cache: dict[tuple[int, int, int], float] = {}
    # every timing of this bench (EXL3 and dense, each A/B path) takes the same graph size, replays and warm-up
    timed = partial(_graph_time_us, calls=args.calls, reps=args.reps, warm_ms=args.warm_ms)
    for in_f, out_f in shapes:
        # enough distinct weight sets that one pass over them is several times the L2
        for k2 in rates:
            bytes_w = in_f * out_f * k2 // 16
            n_sets = max(2, min(24, math.ceil(4 * l2 / bytes_w)))
            layers = [random_layer(in_f, out_f, k2, gen, dev) for _ in range(n_sets)]
            for cb in cbs:
                if k2 % 2 and cb != "mul1":
                    continue
                cb_id = CODEBOOKS.index(cb)
                for rows in rows_list:
                    xs = [torch.randn(rows, in_f, generator=gen).half().to(dev) for _ in range(n_sets)]
                    splits = [0]
                    if args.sweep and rows == 1:
                        n_k = in_f // 128
                        lo, hi = cuda.gemv_ksplit_range(rows, in_f, out_f, k2, cb_id)
                        splits += [
                            s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 28, 32) if lo <= s <= min(hi, n_k)
                        ]
                    auto_ks = cuda.gemv_ksplit(rows, in_f, out_f, k2, cb_id)
                    for ks in splits:

                        def make(
                            i: int, ks: int = ks, layers: list = layers, xs: list = xs, cb_id: int = cb_id
                        ) -> Callable[[], object]:
                            return partial(cuda.gemv, xs[i], *layers[i], cb_id, ksplit=ks)

                        us = timed(make, n_sets)
                        extra: dict = {"sweep": ks != 0}
                        if args.ab_xprep and ks == 0:
                            # the other input-transform path: separate kernel for 1 row, fused for several
                            with cuda.tuned(xprep_min_rows=1 if rows == 1 else 99):
                                extra["other_xprep_us"] = timed(make, n_sets)
                        if args.ab_mul1 and ks == 0 and cb == "mul1":
                            with cuda.tuned(mul1_fp16=1):
                                extra["fp16_kernel_us"] = timed(make, n_sets)
                        if args.ab_pdl and ks == 0:
                            with cuda.tuned(pdl=0):
                                extra["no_pdl_us"] = timed(make, n_sets)
                        key = (in_f, out_f, rows)
                        if key not in dense_cache:
                            n_dense = max(2, math.ceil(4 * l2 / (in_f * out_f * 2)))
                            ws = [
                                torch.randn(in_f, out_f, generator=gen).half().to(dev) for _ in range(n_dense)
                            ]
                            xd = [
                                torch.randn(rows, in_f, generator=gen).half().to(dev) for _ in range(n_dense)
                            ]

                            def make_dense(i: int, xd: list = xd, ws: list = ws) -> Callable[[], object]:
                                return partial(torch.matmul, xd[i], ws[i])

                            dense_cache[key] = timed(make_dense, n_dense)
                            del ws, xd
                        bytes_read = bytes_w + 2 * (in_f + out_f) + 2 * rows * (in_f + out_f)
                        floor_us = bytes_read / (HBM_PEAK_GBS * 1e3)
                        yield TimeResult(
                            "gemv",
                            f"{in_f}x{out_f}",
                            k2_label(k2),
                            cb,
                            rows,
                            ks or auto_ks,
                            us,
                            dense_cache[key],
                            floor_us,
                            bytes_read,
                            extra,
                        )
            layers.clear()
            torch.cuda.empty_cache()


KERNELS: dict[str, KernelSpec] = {"gemv": KernelSpec("gemv", _gemv_check, _gemv_bench)}


# ------------------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------------------


def _machine() -> dict:
    info = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
    }
    try:
        q = "clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,driver_version"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info["nvidia_smi"] = out.stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    return info


def _copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written over time: the practical HBM ceiling."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.int16, device="cuda").random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    stop.record()
    stop.synchronize()
    ms = start.elapsed_time(stop) / 10
    del a, b
    return 2 * 2 * n / (ms * 1e6)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--vectors", default=str(Path(__file__).resolve().parents[3] / "shared/exl3/vectors.safetensors")
    )
    p.add_argument("--out", default=os.environ.get("OUT", "kernels/build/bench"))
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--bits", default="2,3,4", help="comma list of bits per weight to time")
    p.add_argument("--codebooks", default="mul1,3inst")
    p.add_argument("--rows", default="1,8")
    p.add_argument("--sweep", action="store_true", help="also time every split-K for 1 row")
    p.add_argument("--full", action="store_true", help="more shapes")
    p.add_argument("--ab-pdl", action="store_true", help="also time each case with programmatic launch off")
    p.add_argument("--ab-xprep", action="store_true", help="also time each case with the other x' path")
    p.add_argument("--ab-mul1", action="store_true", help="also time mul1 cases through the fp16 kernel")
    p.add_argument("--calls", type=int, default=48, help="calls per CUDA graph")
    p.add_argument("--reps", type=int, default=15, help="graph replays (median)")
    p.add_argument(
        "--warm-ms",
        type=float,
        default=0.0,
        help="ms of graph replays before each timing (sustained-load clock)",
    )
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device; this harness runs on the GPU machine", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"machine": _machine(), "args": vars(args)}
    print("machine:", json.dumps(report["machine"]), flush=True)

    # the checks and --ab-* timings take the A/B paths, whose kernels only the bench build has (exl3_gemv.cu)
    os.environ["SPARKCTL_EXL3_AB_PATHS"] = "1"
    from sparkctl_exl3 import cuda

    t0 = time.time()
    ok = cuda.available()
    report["build_s"] = round(time.time() - t0, 1)
    print(f"build: {'ok' if ok else 'FAILED'} in {report['build_s']} s ({cuda.build_dir()})", flush=True)
    if not ok:
        print(cuda.unavailable_reason(), file=sys.stderr)
        (out / "bench.json").write_text(json.dumps(report, indent=1))
        return 1
    report["copy_gbs"] = round(_copy_bandwidth_gbs(), 1)
    print(f"device copy bandwidth: {report['copy_gbs']} GB/s (read + write)", flush=True)

    failures = 0
    checks = []
    log = (out / "checks.log").open("w")
    selected = [KERNELS[name] for name in args.kernels.split(",")]
    if not args.skip_check:
        for spec in selected:
            for r in spec.check(args):
                checks.append(r.__dict__ | {"ok": r.ok})
                print(
                    f"  check {'ok  ' if r.ok else 'FAIL'} {r.case}: {r.err:.3g} {r.note}",
                    file=log,
                    flush=True,
                )
                if not r.ok:
                    failures += 1
                    print(f"FAIL {r.kernel}: {r.case}: err {r.err:.3g} > {r.tol:g} {r.note}", flush=True)
        worst = max((c["err"] for c in checks if math.isfinite(c["err"])), default=0.0)
        print(f"checks: {len(checks)} run, {failures} failed, worst finite rel err {worst:.3g}", flush=True)
    report["checks"] = checks
    report["check_failures"] = failures
    (out / "bench.json").write_text(json.dumps(report, indent=1))

    times = []
    if not args.skip_bench:
        for spec in selected:
            for t in spec.bench(args):
                times.append(t.__dict__)
                print(
                    f"  {t.kernel} {t.shape:>11} K={t.bits:>3} {t.codebook:5} rows={t.rows} ks={t.ksplit:>2}"
                    f"{' (sweep)' if t.extra.get('sweep') else ''}: {t.us:7.2f} us  dense {t.dense_us:7.2f} us"
                    f"  x{t.dense_us / t.us:5.2f}  floor {t.floor_us:6.2f} us ({100 * t.floor_us / t.us:5.1f}%)"
                    + (f"  no-PDL {t.extra['no_pdl_us']:.2f} us" if "no_pdl_us" in t.extra else "")
                    + (
                        f"  fp16-kernel {t.extra['fp16_kernel_us']:.2f} us"
                        if "fp16_kernel_us" in t.extra
                        else ""
                    )
                    + (
                        f"  other-x' {t.extra['other_xprep_us']:.2f} us"
                        if "other_xprep_us" in t.extra
                        else ""
                    ),
                    flush=True,
                )
        report["times"] = times
        (out / "bench.json").write_text(json.dumps(report, indent=1))
        print(
            "\n| kernel | shape (IxO) | bits | codebook | rows | ksplit | us | dense fp16 us | speedup | floor us | % of floor |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for t in times:
            if t["extra"].get("sweep"):
                continue
            print(
                f"| {t['kernel']} | {t['shape']} | {t['bits']} | {t['codebook']} | {t['rows']} | {t['ksplit']} | "
                f"{t['us']:.2f} | {t['dense_us']:.2f} | {t['dense_us'] / t['us']:.2f}x | {t['floor_us']:.2f} | "
                f"{100 * t['floor_us'] / t['us']:.0f}% |"
            )
    report["machine_after"] = _machine()
    (out / "bench.json").write_text(json.dumps(report, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
