"""The prefill path on a GPU: the reconstruction kernel (``cuda.weight``), reconstruct + cuBLAS (``cuda.gemm`` and
the op for more than 8 rows) and ``cuda.moe_prefill`` against the reference decoder.

Needs a CUDA device (CI has none: skipped there; ``kernels/bench/prefill_bench.py`` runs the full matrix of rates,
codebooks, row counts and timings on the H200).
"""

from __future__ import annotations

import pytest
import torch
from sparkctl_exl3 import ops
from sparkctl_exl3 import reference as ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _layer(in_f: int, out_f: int, k2: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    trellis = torch.randint(
        -32768, 32768, (in_f // 16, out_f // 16, 8 * k2), dtype=torch.int16, generator=gen
    )
    suh = (torch.randn(in_f, generator=gen) / in_f**0.5).half()
    svh = (1.0 + 0.1 * torch.randn(out_f, generator=gen)).half()
    return trellis.cuda(), suh.cuda(), svh.cuda()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize(
    ("k2", "codebook"), [(2, "3inst"), (4, "mul1"), (5, "mul1"), (8, "mcg"), (16, "mul1")]
)
def test_weight_is_the_reference_weight(k2: int, codebook: str) -> None:
    from sparkctl_exl3 import cuda

    trellis, suh, svh = _layer(384, 640, k2, seed=k2)
    expected = ref.weight(trellis, suh, svh, codebook)
    w = cuda.weight(trellis, suh, svh, ref.CODEBOOKS.index(codebook))
    assert _rel(w, expected) < 1e-4
    assert float((w.view(torch.int16) != expected.view(torch.int16)).float().mean()) < 0.01
    assert torch.equal(ops.exl3_weight(trellis, suh, svh, ref.CODEBOOKS.index(codebook)), w)


@pytest.mark.parametrize("rows", [9, 33, 145, 1000])
def test_op_with_prefill_rows_matches_the_reference(rows: int) -> None:
    trellis, suh, svh = _layer(512, 384, 4, seed=rows)
    x = torch.randn(rows, 512, device="cuda").half()
    y = ops.exl3_matmul(x, trellis, suh, svh, "mul1")
    assert _rel(y, ref.matmul(x.float(), trellis, suh, svh, "mul1")) < 1e-3


def test_chunked_gemm_and_graph_capture() -> None:
    """Column chunks give the one-shot result; the reconstruct + cuBLAS path replays in a CUDA graph."""
    from sparkctl_exl3 import cuda

    trellis, suh, svh = _layer(256, 640, 6, seed=3)
    x = torch.randn(64, 256, device="cuda").half()
    whole = cuda.gemm(x, trellis, suh, svh, 1, min_rows=9)
    chunked = cuda.gemm(x, trellis, suh, svh, 1, min_rows=9, chunk_elements=256 * 256)
    assert _rel(chunked, whole) < 1e-3
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cuda.gemm(x, trellis, suh, svh, 1, min_rows=9)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(out, ref.matmul(x.float(), trellis, suh, svh, "mcg")) < 1e-3


def test_moe_prefill_with_a_fat_expert() -> None:
    """300 tokens, every one on expert 1 (the 'more than 256 rows on one expert' case), mixed K and codebooks."""
    from sparkctl_exl3 import cuda

    rates = [(4, "mul1"), (8, "mcg"), (5, "mul1")]
    experts = [
        {
            "gate": (*_layer(256, 384, rates[e % 3][0], 10 * e), rates[e % 3][1]),
            "up": (*_layer(256, 384, rates[e % 3][0], 10 * e + 1), rates[e % 3][1]),
            "down": (*_layer(384, 256, 4, 10 * e + 2), "mul1"),
        }
        for e in range(5)
    ]
    x = torch.randn(300, 256, device="cuda").half()
    scores = torch.rand(300, 5, device="cuda")
    scores[:, 1] += 10.0
    topk_weights, topk_ids = scores.softmax(-1).topk(2, dim=-1)
    y = cuda.moe_prefill(x, topk_ids, topk_weights, experts, "silu")
    expected = torch.zeros(300, 256, dtype=torch.float64, device="cuda")
    for e, ex in enumerate(experts):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        h = torch.nn.functional.silu(ref.matmul(x[tok].float(), *ex["gate"]).float())
        h = h * ref.matmul(x[tok].float(), *ex["up"]).float()
        d = ref.matmul(h.half().float(), *ex["down"]).double()
        expected.index_add_(0, tok, d * topk_weights[tok, slot].double()[:, None])
    assert _rel(y, expected) < 5e-3
