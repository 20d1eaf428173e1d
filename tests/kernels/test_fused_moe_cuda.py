"""The fused EXL3 MoE decode (``sparkctl_exl3.cuda.moe``) against the routed-only CPU reference of the plugin.

Needs a CUDA device (CI has none: skipped there; `kernels/bench/plugin_gpu_check.py` and `kernels/bench/moe_bench.py`
run the same comparison on the H200). Experts are fresh random mul1 layers of mixed K, so one layer takes several
launches; routing has duplicate experts across tokens and, for expert parallelism, ids this rank does not hold.
"""

from __future__ import annotations

import pytest
import torch
from sparkctl_exl3 import checkpoint
from sparkctl_exl3.vllm_plugin.forward import ExpertWeights, ShardWeights, exl3_moe_forward, fused_tables

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HIDDEN, WIDTH = 256, 384


def _shard(i: int, o: int, bits: float, gen: torch.Generator) -> ShardWeights:
    t = checkpoint.random_exl3_layer(i, o, bits, "mul1", gen)
    return ShardWeights(t["trellis"], t["suh"], t["svh"], "mul1", bits)


def _experts(n: int, gated: bool, seed: int) -> list[ExpertWeights]:
    gen = torch.Generator().manual_seed(seed)
    rates = (2, 4, 3, 2.5, 2, 5)
    return [
        ExpertWeights(
            _shard(HIDDEN, WIDTH, rates[e % len(rates)], gen),
            _shard(HIDDEN, WIDTH, rates[(e + 1) % len(rates)], gen) if gated else None,
            _shard(WIDTH, HIDDEN, rates[(e + 2) % len(rates)], gen),
        )
        for e in range(n)
    ]


def _cuda(experts: list[ExpertWeights]) -> list[ExpertWeights]:
    def c(w: ShardWeights | None) -> ShardWeights | None:
        return (
            None
            if w is None
            else ShardWeights(w.trellis.cuda(), w.suh.cuda(), w.svh.cuda(), w.codebook, w.bits)
        )

    return [ExpertWeights(c(e.gate), c(e.up), c(e.down)) for e in experts]  # type: ignore[arg-type]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _poison_allocator() -> None:
    """Leave NaN in the blocks the caching allocator hands out next, so a kernel that skips a write shows up."""
    junk = torch.full((1 << 24,), float("nan"), dtype=torch.float16, device="cuda")
    del junk


@pytest.mark.parametrize("tokens", [1, 3, 8, 33])
@pytest.mark.parametrize("gated,activation", [(True, "silu"), (False, "gelu")])
def test_fused_moe_matches_the_routed_reference(tokens: int, gated: bool, activation: str) -> None:
    experts = _experts(6, gated, seed=tokens)
    ids = list(range(6))
    gen = torch.Generator().manual_seed(100 + tokens)
    x = torch.randn(tokens, HIDDEN, generator=gen).half()
    topk_ids = torch.randint(0, 6, (tokens, 2), generator=gen, dtype=torch.int32)
    topk_ids[:, 1] = (topk_ids[:, 0] + 1) % 6  # two distinct experts per token, shared across tokens
    topk_w = torch.softmax(torch.randn(tokens, 2, generator=gen), -1)
    kw = {"hidden": HIDDEN, "intermediate": WIDTH, "activation": activation}
    expected = exl3_moe_forward(x, topk_w, topk_ids, experts, ids, **kw)
    gpu = _cuda(experts)
    tables = fused_tables(gpu, ids, hidden=HIDDEN, intermediate=WIDTH)
    assert tables is not None
    _poison_allocator()
    y = exl3_moe_forward(x.cuda(), topk_w.cuda(), topk_ids.cuda(), gpu, ids, fused=tables, **kw)
    assert torch.isfinite(y).all()
    assert _rel(y, expected) < 5e-3


def test_fused_moe_expert_parallel_ids_and_bf16() -> None:
    experts = _experts(4, True, seed=7)
    ids = [9, 2, 5, 11]  # the global ids this rank holds; 0, 1, 3, ... are held elsewhere
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(5, HIDDEN, generator=gen).to(torch.bfloat16)
    topk_ids = torch.tensor([[9, 0], [2, 5], [11, 11], [3, 4], [5, 9]], dtype=torch.int64)
    topk_w = torch.rand(5, 2, generator=gen)
    kw = {"hidden": HIDDEN, "intermediate": WIDTH, "activation": "silu"}
    expected = exl3_moe_forward(x.half(), topk_w, topk_ids, experts, ids, **kw)
    gpu = _cuda(experts)
    tables = fused_tables(gpu, ids, hidden=HIDDEN, intermediate=WIDTH)
    y = exl3_moe_forward(x.cuda(), topk_w.cuda(), topk_ids.cuda(), gpu, ids, fused=tables, **kw)
    assert y.dtype == torch.bfloat16
    assert y[3].abs().max() == 0  # neither of token 3's experts is held here
    assert _rel(y, expected) < 1e-2


def test_fused_moe_under_a_cuda_graph_follows_new_routing() -> None:
    gpu = _cuda(_experts(6, True, seed=3))
    ids = list(range(6))
    tables = fused_tables(gpu, ids, hidden=HIDDEN, intermediate=WIDTH)
    kw = {"hidden": HIDDEN, "intermediate": WIDTH, "activation": "silu", "fused": tables}
    x = torch.zeros(2, HIDDEN, device="cuda", dtype=torch.float16)
    w = torch.full((2, 2), 0.5, device="cuda")
    i = torch.zeros(2, 2, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        exl3_moe_forward(x, w, i, gpu, ids, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = exl3_moe_forward(x, w, i, gpu, ids, **kw)
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        x.copy_(torch.randn(2, HIDDEN, generator=gen))
        i.copy_(torch.randint(0, 6, (2, 2), generator=gen, dtype=torch.int32))
        graph.replay()
        eager = exl3_moe_forward(x.clone(), w.clone(), i.clone(), gpu, ids, **kw)
        torch.cuda.synchronize()
        assert torch.equal(y, eager)  # deterministic: the same sums in the same order
