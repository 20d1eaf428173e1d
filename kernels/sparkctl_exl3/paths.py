"""Which EXL3 compute path each call took, counted per process.

A kernel that is not taken falls back silently by design (the reference decoder, the per-expert MoE loop), so a
wrong shape rule or a missing extension would show only as slowness. The engine check
(``kernels/bench/engine_check.py``) reads these counts after serving a model and prints which path every layer
kind reached. Counted in Python where the dispatch happens: an eager call and a CUDA-graph capture count once
each, a graph replay does not run Python and counts nothing, so the counts say which paths were reached, not how
often they ran. One dict increment per call, next to a kernel launch.
"""

from __future__ import annotations

from collections import Counter

#: path name -> what it is (the names the counts use)
PATHS = {
    "gemv": "linear, 1-8 rows: the EXL3 GEMV kernel",
    "gemm-gemv": "linear, 9 to PREFILL_MIN_ROWS-1 rows: the GEMV kernel in groups of 8",
    "gemm-recon": "linear, prefill rows: W reconstructed on the GPU + cuBLAS",
    "linear-reference": "linear through the pure-torch reference decoder (CPU, or CUDA without a kernel for it)",
    "weight-recon": "dense W by the reconstruction kernel",
    "weight-reference": "dense W by the reference decoder",
    "moe-fused": "MoE decode: the fused routed-experts kernel",
    "moe-prefill": "MoE prefill: routed experts reconstructed + batched GEMMs",
    "moe-per-expert": "MoE: every local expert through the linear op, weighted by routing (graph capture > 64 tokens, non-mul1 experts)",
    "moe-routed-cpu": "MoE on the CPU: routed experts gathered through the reference",
}

_COUNTS: Counter[str] = Counter()


def hit(path: str) -> None:
    _COUNTS[path] += 1


def counts() -> dict[str, int]:
    """{path: calls} since the process started (or the last :func:`reset`)."""
    return dict(_COUNTS)


def reset() -> None:
    _COUNTS.clear()
