"""EXL3 prefill bench (issue 24): reconstruct W + cuBLAS against dense fp16 and exllamav3 1.6.5, same process.

One command on the GPU machine (kernels/PERF.md, "prefill", records the results):

    python kernels/bench/prefill_bench.py --out $OUT

1. Correctness (fresh random layers; any int16 bit pattern is a valid trellis, SPEC 2.2), every failure counted:
   - ``cuda.weight`` against ``reference.weight`` for every rate and codebook (bit-identical fraction and relative
     error, outputs from NaN-poisoned memory), column slices, a row-strided ``reconstruct_into`` and the grouped
     ``cuda.weights`` with mixed K and codebooks;
   - ``ops.exl3_matmul`` (the op's own dispatch) and ``cuda.gemm`` forced through each path (GEMV groups, one-shot
     reconstruction, column chunks) at m = 9, 17, 33, 145, 1000 against ``reference.matmul``;
   - bad shapes give the binding's one-line errors;
   - ``cuda.moe_prefill`` against the routed-only reference math, with more than 256 tokens on one expert.
2. Timing (events around back-to-back eager calls, medians; exllamav3's reconstruct path allocates and reads no
   routing, but its MoE prefill syncs on the host, so one method for all): m = 16, 64, 512, 2048, 8192 on
   4096x14336 and 14336x4096, K = 2 and 4, mul1 and mcg: ours (reconstruct + matmul), the reconstruction alone,
   dense fp16 ``torch.matmul``, exllamav3 (``peer_exllamav3.gemm``, optional), TFLOP/s, and the GB10 projection.
3. ``--sweep``: m = 8..64, the GEMV in groups of 8 against reconstruct + matmul: where the crossover is, i.e. the
   measured value for ``cuda.PREFILL_MIN_ROWS``.
4. ``--moe``: a GLM-like layer (hidden 4096, width 1536, 128 experts, top-8, K=2 mul1), 2048 tokens: ours against
   exllamav3's BlockSparseMLP on the same routing.

GB10 projection (printed per case): bytes = trellis + W written + W read back + x + y at 273 GB/s (the Spark's
LPDDR5x), against the matmul's 2mIO flops at :data:`GB10_FP16_TFLOPS`; the chunked variant assumes each W chunk
is read back from L2 (only trellis + x per chunk + y reach memory). Writes ``<out>/prefill_bench.json``.
Exit 0 all checks passed, 1 a check failed, 2 no CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent))

import compiled_rates  # noqa: E402
from sparkctl_exl3 import reference  # noqa: E402

CODEBOOKS = reference.CODEBOOKS
# twice the bits per weight, as the kernels are compiled (csrc/exl3_common.cuh, EXL3_RATES); odd = mul1 only
RATES_K2 = compiled_rates.rates_k2()
REL_TOL = 1e-3
GB10_GBS = 273.0  # LPDDR5x, NVIDIA's DGX Spark datasheet
# fp16 mma with fp32 accumulation on the GB10: 1 PFLOP FP4 with sparsity (NVIDIA) = 500 dense, halved per precision
# step: 250 FP8, 125 FP16. A measured large FP8 GEMM reached 188 TFLOP/s (NVIDIA developer forum, "SM121 CUTLASS
# kernel optimization results", 2026), i.e. ~94 at FP16: the projection uses the practical figure.
GB10_FP16_TFLOPS = 94.0
GB10_FP16_PEAK_TFLOPS = 125.0
ODD_ROWS = (9, 17, 33, 145, 1000)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.double(), b.double()
    if not torch.isfinite(a64).all():
        return math.inf
    return float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))


def k2_label(k2: int) -> str:
    return str(k2 // 2) if k2 % 2 == 0 else f"{k2 / 2:.1f}"


def random_layer(in_f: int, out_f: int, k2: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A random layer on the GPU; suh ~ 1/sqrt(I) scale and svh ~ 1 keep y of unit size."""
    trellis = torch.randint(
        -32768, 32768, (in_f // 16, out_f // 16, 8 * k2), generator=gen, dtype=torch.int32, device="cuda"
    ).to(torch.int16)
    sign = torch.randint(0, 2, (in_f,), generator=gen, device="cuda") * 2 - 1
    suh = (sign * (1.0 + 0.1 * torch.rand(in_f, generator=gen, device="cuda")) / math.sqrt(in_f)).half()
    svh = (1.0 + 0.1 * torch.randn(out_f, generator=gen, device="cuda")).half()
    return trellis, suh, svh


def poisoned(fn: Callable[[], torch.Tensor], shape: tuple[int, ...]) -> tuple[torch.Tensor, bool]:
    """fn() after leaving a NaN block of the output's size in torch's cache: an element the kernel did not write
    shows as NaN. Returns (output, whether it landed in the poisoned block)."""
    poison = torch.full(shape, float("nan"), dtype=torch.float16, device="cuda")
    ptr = poison.data_ptr()
    del poison
    y = fn()
    return y, y.data_ptr() == ptr


class Checks:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, case: str, err: float, tol: float = REL_TOL, note: str = "") -> None:
        ok = err <= tol
        self.rows.append({"case": case, "err": err, "tol": tol, "ok": ok, "note": note})
        print(f"  {'ok  ' if ok else 'FAIL'} {case}: {err:.3g} (tol {tol:g}) {note}", flush=True)

    def fail(self, case: str, why: str) -> None:
        self.rows.append({"case": case, "err": math.inf, "tol": 0.0, "ok": False, "note": why})
        print(f"  FAIL {case}: {why}", flush=True)

    @property
    def failures(self) -> int:
        return sum(not r["ok"] for r in self.rows)


# ------------------------------------------------------------------------------------------------------------
# 1. correctness
# ------------------------------------------------------------------------------------------------------------


def check_weights(ck: Checks, gen: torch.Generator) -> None:
    from sparkctl_exl3 import cuda, ops

    in_f, out_f = 384, 512
    for k2 in RATES_K2:
        for cb in compiled_rates.codebooks(k2):
            cb_id = CODEBOOKS.index(cb)
            trellis, suh, svh = random_layer(in_f, out_f, k2, gen)
            ref = reference.weight(trellis, suh, svh, cb)
            w, landed = poisoned(
                lambda t=trellis, s=suh, v=svh, c=cb_id: cuda.weight(t, s, v, c), (in_f, out_f)
            )
            same = float((w.view(torch.int16) == ref.view(torch.int16)).float().mean())
            ck.add(
                f"W K={k2_label(k2)} {cb}",
                rel_err(w, ref),
                note=f"bit-identical {100 * same:.2f}%{'' if landed else ' (poison not reused)'}",
            )
            if k2 == 4:
                op = ops.exl3_weight(trellis, suh, svh, cb_id)
                ck.add(f"ops.exl3_weight K=2 {cb} equals cuda.weight", float(not torch.equal(op, w)), 0.0)
    trellis, suh, svh = random_layer(in_f, out_f, 5, gen)
    ref = reference.weight(trellis, suh, svh, "mul1")
    part = cuda.weight(trellis, suh, svh, 2, col0=128, cols=256)
    ck.add("W column slice 128..384 K=2.5 mul1", rel_err(part, ref[:, 128:384]))
    big = torch.full((in_f, 1024), float("nan"), dtype=torch.float16, device="cuda")
    mod = cuda._module_or_raise()
    mod.reconstruct_into([trellis], [suh], [svh], 2, big[:, 256:640], 0)  # rows strided by 1024
    ck.add("reconstruct_into a row-strided slice", rel_err(big[:, 256:640][:, :out_f], ref[:, :384]))
    ck.add("reconstruct_into leaves the rest", float(not torch.isnan(big[:, :256]).all()), 0.0)
    layers, refs = [], []
    for k2, cb_id in [(4, 2), (8, 0), (4, 2), (3, 2), (4, 1), (4, 2)]:
        t, s, v = random_layer(256, 384, k2, gen)
        layers.append((t, s, v, cb_id))
        refs.append(reference.weight(t, s, v, CODEBOOKS[cb_id]))
    got = cuda.weights(layers)
    ck.add("weights() grouped, mixed K/codebooks", max(rel_err(g, r) for g, r in zip(got, refs, strict=True)))
    # 40 layers of one group: two launches of 32 + 8
    many = [(*random_layer(128, 128, 2, gen), 1) for _ in range(40)]
    got = cuda.weights(many)
    ck.add(
        "weights() 40 layers (2 launches)",
        max(rel_err(g, reference.weight(t, s, v, "mcg")) for g, (t, s, v, _) in zip(got, many, strict=True)),
    )


def check_gemm(ck: Checks, gen: torch.Generator) -> None:
    from sparkctl_exl3 import cuda, ops

    in_f, out_f = 1024, 768
    for cb_id, cb in enumerate(CODEBOOKS):
        for k2 in (4, 8) if cb != "mul1" else (4, 8, 5):
            trellis, suh, svh = random_layer(in_f, out_f, k2, gen)
            for m in ODD_ROWS:
                x = torch.randn(m, in_f, generator=gen, device="cuda").half()
                ref = reference.matmul(x.float(), trellis, suh, svh, cb)
                y, _ = poisoned(partial(ops.exl3_matmul, x, trellis, suh, svh, cb), (m, out_f))
                ck.add(f"op y m={m} K={k2_label(k2)} {cb}", rel_err(y, ref))
            x = torch.randn(145, in_f, generator=gen, device="cuda").half()
            ref = reference.matmul(x.float(), trellis, suh, svh, cb)
            for label, kw in [
                ("GEMV groups", {"min_rows": 1 << 30}),
                ("one-shot reconstruction", {"min_rows": 9}),
                ("column chunks of 256", {"min_rows": 9, "chunk_elements": in_f * 256}),
                ("column chunks of 128 (6 chunks)", {"min_rows": 9, "chunk_elements": 1}),
            ]:
                y, _ = poisoned(partial(cuda.gemm, x, trellis, suh, svh, cb_id, **kw), (145, out_f))
                ck.add(f"gemm {label} m=145 K={k2_label(k2)} {cb}", rel_err(y, ref))
    # leading dims through the op
    trellis, suh, svh = random_layer(256, 384, 4, gen)
    x = torch.randn(3, 11, 256, generator=gen, device="cuda").half()
    ck.add(
        "op y [3, 11, 256] (33 rows)",
        rel_err(
            ops.exl3_matmul(x, trellis, suh, svh, "mul1"),
            reference.matmul(x.float(), trellis, suh, svh, "mul1"),
        ),
    )


def check_errors(ck: Checks, gen: torch.Generator) -> None:
    from sparkctl_exl3 import cuda

    trellis, suh, svh = random_layer(256, 384, 4, gen)
    half_rate = random_layer(256, 384, 5, gen)[0]  # 2.5 bits: mul1 only
    no_rate = random_layer(256, 384, 9, gen)[0]  # 4.5 bits: not a rate
    cases = [
        ("fp32 trellis", lambda: cuda.weight(trellis.float(), suh, svh, 2), "trellis must be int16"),
        ("short suh", lambda: cuda.weight(trellis, suh[:128], svh, 2), "suh must be [256]"),
        ("fp32 svh", lambda: cuda.weight(trellis, suh, svh.float(), 2), "suh and svh must be float16"),
        ("CPU suh", lambda: cuda.weight(trellis, suh.cpu(), svh, 2), "must all be CUDA tensors"),
        (
            "2.5 bits 3inst",
            lambda: cuda.weight(half_rate, suh, svh, 0),
            "half-integer rates",
        ),
        (
            "4.5 bits",
            lambda: cuda.weight(no_rate, suh, svh, 2),
            "1..8 bits per weight",
        ),
        ("codebook 3", lambda: cuda.weight(trellis, suh, svh, 3), "codebook must be 0"),
        ("col0 64", lambda: cuda.weight(trellis, suh, svh, 2, col0=64, cols=128), "multiples of 128"),
        ("cols past O", lambda: cuda.weight(trellis, suh, svh, 2, col0=256, cols=256), "col0 + cols"),
        ("I = 64", lambda: cuda.weight(trellis[:4].contiguous(), suh[:64], svh, 2), "multiples of 128"),
        (
            "x width",
            lambda: cuda.gemm(torch.zeros(64, 128, device="cuda").half(), trellis, suh, svh, 2, min_rows=9),
            "features",
        ),
    ]
    for label, fn, want in cases:
        try:
            fn()
        except (RuntimeError, ValueError, TypeError) as exc:
            msg = str(exc).splitlines()[0]
            ck.add(f"error: {label}", float(want not in msg), 0.0, note=msg[:160])
        else:
            ck.fail(f"error: {label}", "no error raised")


def reference_moe(x, topk_ids, topk_weights, experts, act) -> torch.Tensor:
    """The routed-only math (vllm_plugin.forward._moe_routed) on reference.matmul, per (token, slot) pair."""
    out = torch.zeros(x.shape[0], experts[0]["down"][0].shape[1] * 16, dtype=torch.float64, device=x.device)
    for e, ex in enumerate(experts):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        xe = x[tok].float()
        h = act(reference.matmul(xe, *ex["gate"][:3], ex["gate"][3]).float())
        h = h * reference.matmul(xe, *ex["up"][:3], ex["up"][3]).float()
        y = reference.matmul(h.half().float(), *ex["down"][:3], ex["down"][3]).double()
        out.index_add_(0, tok, y * topk_weights[tok, slot].double()[:, None])
    return out


def check_moe(ck: Checks, gen: torch.Generator) -> None:
    from sparkctl_exl3 import cuda

    hidden, width, n_exp, top_k, tokens = 512, 256, 12, 4, 300
    experts = []
    for e in range(n_exp):
        k2, cb = [(4, "mul1"), (8, "mcg"), (5, "mul1"), (6, "3inst")][e % 4]
        experts.append(
            {
                "gate": (*random_layer(hidden, width, k2, gen), cb),
                "up": (*random_layer(hidden, width, k2, gen), cb),
                "down": (*random_layer(width, hidden, 4, gen), "mul1"),
            }
        )
    x = torch.randn(tokens, hidden, generator=gen, device="cuda").half()
    scores = torch.rand(tokens, n_exp, generator=gen, device="cuda")
    scores[:, 3] += 10.0  # every token on expert 3: more than 256 rows for one expert (the "fat expert" case)
    topk_weights, topk_ids = scores.softmax(-1).topk(top_k, dim=-1)
    topk_ids[:5, 1] = 99  # another rank's expert: adds nothing
    ref = reference_moe(x, topk_ids, topk_weights, experts, torch.nn.functional.silu)
    y, _ = poisoned(lambda: cuda.moe_prefill(x, topk_ids, topk_weights, experts, "silu"), (tokens, hidden))
    ck.add(f"moe_prefill {tokens} tokens, fat expert (300 rows), mixed K/codebooks", rel_err(y, ref), 5e-3)
    y2 = cuda.moe_prefill(
        x, topk_ids, topk_weights, experts, "silu", scratch_elements=1
    )  # one expert at a time
    ck.add("moe_prefill one expert per batch equals the default", rel_err(y2, y), 1e-6)


# ------------------------------------------------------------------------------------------------------------
# 2-4. timing
# ------------------------------------------------------------------------------------------------------------


def time_us(fn: Callable[[], object], calls: int, reps: int) -> float:
    """Median over `reps` of the mean time of `calls` back-to-back eager calls (CUDA events)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0 / calls)
    return statistics.median(times)


def gb10_projection(m: int, in_f: int, out_f: int, k2: int) -> dict:
    """Seconds on the GB10: memory bytes at 273 GB/s against the matmul's flops at the GB10's fp16 rate."""
    trellis = in_f * out_f * k2 / 16
    w = 2 * in_f * out_f
    xy = 2 * m * (in_f + out_f)
    t_mma = 2 * m * in_f * out_f / (GB10_FP16_TFLOPS * 1e12)
    t_recon = (trellis + w) / (GB10_GBS * 1e9)  # the reconstruction kernel: memory bound
    t_mm = max(t_mma, (w + xy) / (GB10_GBS * 1e9))  # cuBLAS: W read back + x + y, or the mma work
    dense = max(t_mma, (w + xy) / (GB10_GBS * 1e9))
    chunked = t_mma + trellis / (
        GB10_GBS * 1e9
    )  # W chunks written and read in L2: only the trellis reaches memory
    flops = 2 * m * in_f * out_f
    return {
        "gb10_us": 1e6 * (t_recon + t_mm),
        "gb10_tflops": flops / (t_recon + t_mm) / 1e12,
        "gb10_chunked_tflops": flops / chunked / 1e12,
        "gb10_dense_tflops": flops / dense / 1e12,
        "gb10_bytes": trellis + 2 * w + xy,
    }


def bench_gemm(args: argparse.Namespace, peer, gen: torch.Generator) -> list[dict]:
    from sparkctl_exl3 import cuda

    rows_out = []
    for shape in args.shapes.split(","):
        in_f, out_f = (int(v) for v in shape.split("x"))
        for bits in args.bits.split(","):
            k2 = int(round(2 * float(bits)))
            for cb in args.codebooks.split(","):
                cb_id = CODEBOOKS.index(cb)
                trellis, suh, svh = random_layer(in_f, out_f, k2, gen)
                wd = cuda.weight(trellis, suh, svh, cb_id)  # the dense fp16 baseline uses the same W
                recon_us = time_us(partial(cuda.weight, trellis, suh, svh, cb_id), args.calls, args.reps)
                for m in (int(v) for v in args.rows.split(",")):
                    x = torch.randn(m, in_f, generator=gen, device="cuda").half()
                    flops = 2 * m * in_f * out_f
                    calls = max(2, args.calls * 512 // max(512, m))
                    ours = time_us(
                        partial(cuda.gemm, x, trellis, suh, svh, cb_id, min_rows=9), calls, args.reps
                    )
                    dense = time_us(partial(torch.matmul, x, wd), calls, args.reps)
                    row = {
                        "shape": shape,
                        "bits": k2_label(k2),
                        "codebook": cb,
                        "m": m,
                        "ours_us": ours,
                        "recon_us": recon_us,
                        "dense_us": dense,
                        "ours_tflops": flops / ours / 1e6,
                        "dense_tflops": flops / dense / 1e6,
                        **gb10_projection(m, in_f, out_f, k2),
                    }
                    if peer is not None:
                        try:
                            pe = time_us(partial(peer.gemm, x, trellis, suh, svh, cb), calls, args.reps)
                            row |= {
                                "peer_us": pe,
                                "peer_tflops": flops / pe / 1e6,
                                "peer_path": peer.gemm_path(m),
                            }
                        except Exception as exc:  # the peer is optional; its failure is reported, not fatal
                            row["peer_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    for extra in (int(c) for c in args.chunks.split(",") if c):
                        cols = extra
                        chunked = partial(
                            cuda.gemm, x, trellis, suh, svh, cb_id, min_rows=9, chunk_elements=in_f * cols
                        )
                        t = time_us(chunked, calls, args.reps)
                        row[f"chunk{cols}_tflops"] = flops / t / 1e6
                    rows_out.append(row)
                    print(
                        f"  {shape:>10} K={k2_label(k2):>3} {cb:4} m={m:>5}: ours {row['ours_tflops']:6.1f} TF/s "
                        f"({ours:8.1f} us, recon {recon_us:6.1f} us)  dense {row['dense_tflops']:6.1f}  "
                        f"x{dense / ours:4.2f}"
                        + (
                            f"  exl3 {row['peer_tflops']:6.1f} x{row['peer_us'] / ours:4.2f}"
                            if "peer_us" in row
                            else ""
                        )
                        + f"  | GB10 {row['gb10_tflops']:5.1f} (chunked {row['gb10_chunked_tflops']:5.1f},"
                        f" dense {row['gb10_dense_tflops']:5.1f})",
                        flush=True,
                    )
                if peer is not None:
                    peer.clear_gemm_cache()
    return rows_out


def bench_sweep(args: argparse.Namespace, gen: torch.Generator) -> dict:
    from sparkctl_exl3 import cuda

    rows = [8, 12, 16, 20, 24, 32, 40, 48, 56, 64]
    out: dict = {"cases": []}
    crossovers = []
    for shape in args.shapes.split(","):
        in_f, out_f = (int(v) for v in shape.split("x"))
        for bits in args.bits.split(","):
            k2 = int(round(2 * float(bits)))
            for cb in args.codebooks.split(","):
                cb_id = CODEBOOKS.index(cb)
                trellis, suh, svh = random_layer(in_f, out_f, k2, gen)
                first = None
                for m in rows:
                    x = torch.randn(m, in_f, generator=gen, device="cuda").half()
                    g = time_us(
                        partial(cuda.gemm, x, trellis, suh, svh, cb_id, min_rows=1 << 30), 20, args.reps
                    )
                    r = time_us(partial(cuda.gemm, x, trellis, suh, svh, cb_id, min_rows=1), 20, args.reps)
                    out["cases"].append(
                        {"shape": shape, "bits": bits, "codebook": cb, "m": m, "gemv_us": g, "recon_us": r}
                    )
                    print(
                        f"  sweep {shape} K={bits} {cb} m={m}: gemv groups {g:7.1f} us, recon+matmul {r:7.1f} us"
                    )
                    if first is None and r < g:
                        first = m
                crossovers.append(first if first is not None else rows[-1] + 8)
    # the threshold that is right for every case timed: the largest per-case crossover
    out["crossovers"] = crossovers
    out["recommended_min_rows"] = max(crossovers)
    print(
        f"  threshold: reconstruct + matmul wins from m = {crossovers} -> PREFILL_MIN_ROWS = {max(crossovers)}"
    )
    return out


def bench_moe(args: argparse.Namespace, peer, gen: torch.Generator) -> dict:
    from sparkctl_exl3 import cuda

    hidden, width, n_exp, top_k, tokens = 4096, 1536, 128, 8, args.moe_tokens
    experts = [
        {
            "gate": (*random_layer(hidden, width, 4, gen), "mul1"),
            "up": (*random_layer(hidden, width, 4, gen), "mul1"),
            "down": (*random_layer(width, hidden, 4, gen), "mul1"),
        }
        for _ in range(n_exp)
    ]
    x = torch.randn(tokens, hidden, generator=gen, device="cuda").half()
    scores = torch.rand(tokens, n_exp, generator=gen, device="cuda")
    topk_weights, topk_ids = scores.softmax(-1).topk(top_k, dim=-1)
    ours = time_us(lambda: cuda.moe_prefill(x, topk_ids, topk_weights, experts, "silu"), 3, args.reps)
    res = {"tokens": tokens, "ours_us": ours}
    flops = 2 * tokens * top_k * 3 * hidden * width
    res["ours_tflops"] = flops / ours / 1e6
    if peer is not None:
        try:
            handle = peer.prepare_moe(experts, top_k=top_k, activation="silu")
            ids, wts = peer.routing_for_peer(topk_ids, topk_weights)
            pe = time_us(lambda: peer.moe(x, ids, wts, handle, "silu"), 3, args.reps)
            yp = peer.moe(x, ids, wts, handle, "silu").float()
            yo = cuda.moe_prefill(x, topk_ids, topk_weights, experts, "silu").float()
            res |= {"peer_us": pe, "peer_tflops": flops / pe / 1e6, "ours_vs_peer_rel": rel_err(yo, yp)}
        except Exception as exc:
            res["peer_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    print(f"  MoE GLM-like {tokens} tokens K=2 mul1: {json.dumps(res)}", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="kernels/build/prefill")
    p.add_argument("--shapes", default="4096x14336,14336x4096")
    p.add_argument("--bits", default="2,4")
    p.add_argument("--codebooks", default="mul1,mcg")
    p.add_argument("--rows", default="16,64,512,2048,8192")
    p.add_argument("--chunks", default="", help="also time column chunks of these widths, e.g. 2048,4096")
    p.add_argument(
        "--calls", type=int, default=10, help="back-to-back calls per timing at m <= 512 (fewer above)"
    )
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--sweep", action="store_true", help="the GEMV / reconstruct crossover, m = 8..64")
    p.add_argument("--moe", action="store_true", help="time the GLM-like MoE prefill")
    p.add_argument("--moe-tokens", type=int, default=2048)
    p.add_argument("--no-peer", action="store_true", help="skip exllamav3")
    p.add_argument(
        "--peer-no-jit", action="store_true", help="use exllamav3 only if prebuilt (peer_build.sh)"
    )
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--seed", type=int, default=24)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device; this bench runs on the GPU machine", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args)}
    from sparkctl_exl3 import cuda

    t0 = time.time()
    if not cuda.available():
        print(f"error: {cuda.unavailable_reason()}", file=sys.stderr)
        return 1
    report["build_s"] = round(time.time() - t0, 1)
    print(f"build: {report['build_s']} s; device {report['gpu']}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    ck = Checks()
    if not args.skip_check:
        for step in (check_weights, check_gemm, check_errors, check_moe):
            try:
                step(ck, gen)
            except Exception:
                ck.fail(step.__name__, traceback.format_exc(limit=3).strip().splitlines()[-1])
                traceback.print_exc()
        print(f"checks: {len(ck.rows)} run, {ck.failures} failed", flush=True)
    report["checks"] = ck.rows
    (out / "prefill_bench.json").write_text(json.dumps(report, indent=1))
    peer = None
    if not args.skip_bench and not args.no_peer:
        try:
            import peer_exllamav3 as peer_mod  # another branch's file: optional

            peer_mod.load(allow_jit=not args.peer_no_jit)
            peer = peer_mod
            report["peer"] = peer_mod.info()
        except Exception as exc:
            report["peer"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(f"peer: {report['peer']}", flush=True)
    if not args.skip_bench:
        for name, fn in (
            ("gemm", lambda: bench_gemm(args, peer, gen)),
            ("sweep", lambda: bench_sweep(args, gen) if args.sweep else None),
            ("moe", lambda: bench_moe(args, peer, gen) if args.moe else None),
        ):
            try:
                report[name] = fn()
            except Exception as exc:
                traceback.print_exc()
                report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            (out / "prefill_bench.json").write_text(json.dumps(report, indent=1))
        print(
            "\n| IxO | K | cb | m | ours TF/s | recon us | dense TF/s | ours/dense | exl3 TF/s | ours/exl3 | GB10 TF/s (chunked) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in report.get("gemm") or []:
            if not isinstance(r, dict):
                continue
            pe = r.get("peer_tflops")
            pe_cols = "| |" if pe is None else f"{pe:.0f} | {r['ours_tflops'] / pe:.2f} |"
            print(
                f"| {r['shape']} | {r['bits']} | {r['codebook']} | {r['m']} | {r['ours_tflops']:.0f} | "
                f"{r['recon_us']:.1f} | {r['dense_tflops']:.0f} | {r['ours_tflops'] / r['dense_tflops']:.2f} | "
                f"{pe_cols} {r['gb10_tflops']:.0f} ({r['gb10_chunked_tflops']:.0f}) |"
            )
    return 1 if ck.failures else 0


if __name__ == "__main__":
    sys.exit(main())
