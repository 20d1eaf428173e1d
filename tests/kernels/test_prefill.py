"""The prefill path (issue 24) without a GPU: the reconstruction kernel's layout, modelled lane by lane, against the
reference; and the Python around the kernel (cuda.gemm's paths and column chunks, cuda.weights' grouping,
cuda.moe_prefill's sorting, batching and scatter, the ops' dispatch by rows) on real numbers.

The compiled extension cannot run here, so those tests install a stand-in for it that reconstructs with the
reference decoder (``reference.weight``) and records its calls: what is checked is everything ``cuda.py`` and
``ops.py`` do with the kernel's results. The kernel itself is checked against the reference on the device by
``kernels/bench/prefill_bench.py`` (kernels/PERF.md).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
from sparkctl_exl3 import cuda, ops
from sparkctl_exl3 import reference as ref

BENCH = Path(__file__).resolve().parents[2] / "kernels" / "bench"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _layer(in_f: int, out_f: int, k2: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    trellis = torch.randint(
        -32768, 32768, (in_f // 16, out_f // 16, 8 * k2), dtype=torch.int16, generator=gen
    )
    suh = (torch.randn(in_f, generator=gen) / in_f**0.5).half()
    svh = (1.0 + 0.1 * torch.randn(out_f, generator=gen)).half()
    return trellis, suh, svh


# ------------------------------------------------------------------------------------------------
# The kernel's arithmetic, modelled lane by lane (kernels/bench/recon_model.py)
# ------------------------------------------------------------------------------------------------


def _recon_model() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("recon_model", BENCH / "recon_model.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("k2", [2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16])
def test_the_kernels_state_cuts_are_unpack_states(k2: int) -> None:
    """Each lane's raw words (wrapping around the ring), funnel-shifted to its first window, cut at compile-time
    offsets: the 256 states of a tile in trellis order, for every rate."""
    trellis = torch.randint(
        -32768, 32768, (1, 1, 8 * k2), dtype=torch.int16, generator=torch.Generator().manual_seed(k2)
    )
    u = (trellis[0, 0].to(torch.int64) & 0xFFFF).tolist()
    words = [u[2 * q] | (u[2 * q + 1] << 16) for q in range(4 * k2)]
    states = _recon_model()._states(words, k2).flatten()
    assert torch.equal(states, ref.unpack_states(trellis)[0, 0].to(torch.int64))


@pytest.mark.parametrize(("k2", "codebook"), [(2, "mcg"), (4, "mul1"), (5, "mul1"), (16, "3inst")])
def test_the_kernels_layout_reconstructs_the_reference_weight(k2: int, codebook: str) -> None:
    """Bit positions, mma fragment layouts, the sign-folded H8, the hi/lo split and the shared-memory butterfly of
    exl3_recon.cu, transcribed index for index: W within 1e-4 of reference.weight, all but a few fp16 last bits
    identical (a layout error would scramble whole tiles)."""
    rel, differing = _recon_model().check(k2, codebook, seed=k2)
    assert rel < 1e-4
    assert differing < 0.01


# ------------------------------------------------------------------------------------------------
# A stand-in for the compiled extension (CPU, reference decoder)
# ------------------------------------------------------------------------------------------------


class StandIn:
    """The extension's prefill entry points computed by the reference; ``calls`` records what was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def reconstruct(self, trellis, suh, svh, codebook_id, col0, cols):  # noqa: ANN001, ANN201
        w = ref.weight(trellis, suh, svh, ref.CODEBOOKS[codebook_id])
        cols = w.shape[1] - col0 if cols < 0 else cols
        self.calls.append(("reconstruct", col0, cols))
        return w[:, col0 : col0 + cols].clone()

    def reconstruct_into(self, trellis, suh, svh, codebook_id, out, col0):  # noqa: ANN001, ANN201
        assert len({tuple(t.shape) for t in trellis}) == 1, "one launch takes one shape"
        self.calls.append(("into", len(trellis), codebook_id, col0, out.shape[-1]))
        for i, (t, s, v) in enumerate(zip(trellis, suh, svh, strict=True)):
            w = ref.weight(t, s, v, ref.CODEBOOKS[codebook_id])[:, col0 : col0 + out.shape[-1]]
            (out[i] if out.dim() == 3 else out).copy_(w)

    def gemv(self, x, trellis, suh, svh, codebook_id, workspace, ksplit):  # noqa: ANN001, ANN201
        self.calls.append(("gemv", x.shape[0]))
        return ref.matmul(x, trellis, suh, svh, ref.CODEBOOKS[codebook_id])

    def recon_supports(self, in_f: int, out_f: int, k2: int, codebook_id: int) -> bool:
        return in_f % 128 == 0 and out_f % 128 == 0


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> StandIn:
    module = StandIn()
    monkeypatch.setattr(cuda, "_module", module)
    return module


def test_gemm_reconstructs_once_or_in_column_chunks(stand_in: StandIn) -> None:
    trellis, suh, svh = _layer(256, 640, 4, seed=1)
    rows = cuda.PREFILL_MIN_ROWS
    x = torch.randn(rows, 256).half()
    expected = ref.matmul(x, trellis, suh, svh, "mul1")
    y = cuda.gemm(x, trellis, suh, svh, 2)  # the threshold's rows: one reconstruction
    assert stand_in.calls == [("reconstruct", 0, 640)]
    assert y.shape == (rows, 640) and y.dtype == torch.float16 and _rel(y, expected) < 2e-3
    stand_in.calls.clear()
    y = cuda.gemm(x, trellis, suh, svh, 2, chunk_elements=256 * 300)  # 256 columns per chunk: 256 + 256 + 128
    assert stand_in.calls == [("into", 1, 2, 0, 256), ("into", 1, 2, 256, 256), ("into", 1, 2, 512, 128)]
    assert _rel(y, expected) < 2e-3
    stand_in.calls.clear()
    y = cuda.gemm(x, trellis, suh, svh, 2, min_rows=rows + 1)  # below the threshold: the GEMV (groups of 8)
    assert stand_in.calls == [("gemv", rows)]
    assert _rel(y, expected) < 2e-3


def test_gemm_refuses_what_the_kernel_cannot_take(stand_in: StandIn) -> None:
    trellis, suh, svh = _layer(256, 384, 4, seed=2)
    rows = cuda.PREFILL_MIN_ROWS
    with pytest.raises(RuntimeError, match="x must be float16"):
        cuda.gemm(torch.randn(rows, 256), trellis, suh, svh, 2)
    with pytest.raises(RuntimeError, match="x has 128 features but the trellis has 256"):
        cuda.gemm(torch.randn(rows, 128).half(), trellis, suh, svh, 2)
    with pytest.raises(ValueError, match="x must be 2-D"):
        cuda.gemm(torch.randn(2, 20, 256).half(), trellis, suh, svh, 2)
    assert stand_in.calls == []


def test_weights_launch_once_per_shape_and_codebook_in_input_order(stand_in: StandIn) -> None:
    specs = [(256, 384, 4, 2), (256, 384, 8, 0), (256, 384, 4, 2), (128, 256, 5, 2), (256, 384, 4, 1)]
    layers = [(*_layer(i, o, k2, seed=n), cb) for n, (i, o, k2, cb) in enumerate(specs)]
    got = cuda.weights(layers)
    assert sorted(stand_in.calls) == sorted(
        [("into", 2, 2, 0, 384), ("into", 1, 0, 0, 384), ("into", 1, 2, 0, 256), ("into", 1, 1, 0, 384)]
    )
    for w, (t, s, v, cb) in zip(got, layers, strict=True):
        assert torch.equal(w, ref.weight(t, s, v, ref.CODEBOOKS[cb]))
    with pytest.raises(ValueError, match="at least one layer"):
        cuda.weights([])


def _experts(hidden: int, width: int, n: int) -> list[dict]:
    rates = [(4, "mul1"), (8, "mcg"), (5, "mul1"), (6, "3inst")]
    out = []
    for e in range(n):
        k2, cb = rates[e % len(rates)]
        out.append(
            {
                "gate": (*_layer(hidden, width, k2, seed=10 * e), cb),
                "up": (*_layer(hidden, width, k2, seed=10 * e + 1), cb),
                "down": (*_layer(width, hidden, 4, seed=10 * e + 2), "mul1"),
            }
        )
    return out


def _routed_reference(x, topk_ids, topk_weights, experts, intermediate=None) -> torch.Tensor:  # noqa: ANN001
    """Pair by pair, as vllm_plugin.forward._moe_routed computes it, on reference.matmul (fp64 sum)."""
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    for t in range(topk_ids.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            if not 0 <= e < len(experts):
                continue
            ex, xt = experts[e], x[t : t + 1]
            h = torch.nn.functional.silu(ref.matmul(xt, *ex["gate"]).float())
            h = h * ref.matmul(xt, *ex["up"]).float()
            if intermediate is not None:
                h[:, intermediate:] = 0.0
            out[t] += ref.matmul(h.half(), *ex["down"])[0].double() * float(topk_weights[t, j])
    return out


def test_moe_prefill_is_the_routed_sum(stand_in: StandIn) -> None:
    """Tokens sorted by expert, only routed experts reconstructed (grouped launches), every row of a fat expert
    (here all 40 tokens on expert 2), other ranks' ids dropped, mixed K and codebooks."""
    hidden, width, n_exp = 128, 256, 6
    experts = _experts(hidden, width, n_exp)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(40, hidden, generator=gen).half()
    topk_ids = torch.randint(0, n_exp - 1, (40, 2), generator=gen)  # expert 5 is never routed
    topk_ids[:, 0] = 2
    topk_ids[:, 1] = torch.where(topk_ids[:, 1] == 2, 3, topk_ids[:, 1])
    topk_ids[0, 1] = 17  # another rank's expert
    topk_weights = torch.rand(40, 2, generator=gen)
    expected = _routed_reference(x, topk_ids, topk_weights, experts)
    y = cuda.moe_prefill(x, topk_ids, topk_weights, experts, "silu")
    assert y.shape == x.shape and y.dtype == torch.float16
    assert _rel(y, expected) < 5e-3
    routed = sorted({int(e) for e in topk_ids.flatten() if 0 <= e < n_exp})
    assert sum(c[1] for c in stand_in.calls) == 3 * len(
        routed
    )  # three projections of each routed expert only
    stand_in.calls.clear()
    y1 = cuda.moe_prefill(
        x, topk_ids, topk_weights, experts, "silu", scratch_elements=1
    )  # one expert per batch
    assert _rel(y1, y) < 1e-6
    # one expert per unit: gate, up and down one launch each
    assert [c[1] for c in stand_in.calls] == [1, 1, 1] * len(routed)


def test_a_prepared_table_is_the_same_sum_and_one_rate_is_one_launch(stand_in: StandIn) -> None:
    """The plugin prepares a layer's table once (moe_prefill_prepare); a call with it computes what a call with the
    experts does, and a class's members are ordered by rate, so each rate of a projection is one launch."""
    hidden, width, n_exp = 128, 256, 8
    experts = _experts(hidden, width, n_exp)  # four rates, alternating by index
    table = cuda.moe_prefill_prepare(experts)
    assert (table.n_experts, table.hidden, table.width, table.gated) == (n_exp, hidden, width, True)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(64, hidden, generator=gen).half()
    topk_ids = torch.arange(64 * 2).reshape(64, 2) % n_exp  # 16 pairs per expert: one row class
    topk_weights = torch.rand(64, 2, generator=gen)
    y = cuda.moe_prefill(x, topk_ids, topk_weights, table, "silu")
    gate_launches = [c for c in stand_in.calls if c[3:] == (0, width) and c[1] > 0][:4]
    assert [c[1] for c in gate_launches] == [2, 2, 2, 2]  # gate: 4 rates x 2 experts, not 8 launches
    stand_in.calls.clear()
    assert torch.equal(y, cuda.moe_prefill(x, topk_ids, topk_weights, experts, "silu"))
    assert _rel(y, _routed_reference(x, topk_ids, topk_weights, experts)) < 5e-3
    with pytest.raises(ValueError, match="x has 256 features; the experts' gate takes 128"):
        cuda.moe_prefill(torch.randn(4, 256).half(), topk_ids[:4], topk_weights[:4], table)


def test_row_classes_bound_the_padding() -> None:
    """Experts are padded to a few row classes for the batched GEMMs: never fewer rows than routed, at most 25%
    more above 64 rows (16-row steps below), and a 2048-token fat expert lands in a class of its own."""
    previous = 0
    for count in range(1, 5000):
        rows = cuda._row_class(count)
        assert rows >= count and rows % 16 == 0 and rows >= previous
        assert rows <= (max(16, -(-count // 16) * 16) if count <= 64 else 1.25 * count + 16)
        previous = rows
    assert len({cuda._row_class(c) for c in range(1, 2049)}) < 24


def test_moe_prefill_cuts_a_padded_intermediate(stand_in: StandIn) -> None:
    experts = _experts(128, 256, 3)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(12, 128, generator=gen).half()
    topk_ids = torch.randint(0, 3, (12, 2), generator=gen)
    topk_weights = torch.rand(12, 2, generator=gen)
    y = cuda.moe_prefill(x, topk_ids, topk_weights, experts, "silu", intermediate=128)
    assert _rel(y, _routed_reference(x, topk_ids, topk_weights, experts, intermediate=128)) < 5e-3


def test_moe_prefill_refuses_bad_input(stand_in: StandIn) -> None:
    experts = _experts(128, 256, 2)
    x = torch.randn(4, 128).half()
    with pytest.raises(ValueError, match="topk_ids, topk_weights"):
        cuda.moe_prefill(x, torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 3), experts)
    with pytest.raises(ValueError, match="at least one expert"):
        cuda.moe_prefill(x, torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2), [])
    with pytest.raises(KeyError):
        cuda.moe_prefill(x, torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2), experts, "swish")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_prefill_supports_is_false_without_the_kernels() -> None:
    trellis, suh, svh = _layer(256, 384, 4, seed=3)
    assert cuda.prefill_supports(torch.zeros(64, 256).half(), trellis, suh, svh, 2) is False
    with pytest.raises(RuntimeError, match="unavailable"):
        cuda.weight(trellis, suh, svh, 2)


# ------------------------------------------------------------------------------------------------
# The op's dispatch by rows (ops._exl3_gemm_cuda with a stand-in kernel module)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def op_kernel(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    calls: list[tuple[str, int]] = []

    def gemv(x, trellis, suh, svh, codebook_id):  # noqa: ANN001, ANN202
        calls.append(("gemv", x.shape[0]))
        return ref.matmul(x, trellis, suh, svh, ref.CODEBOOKS[codebook_id])

    def gemm(x, trellis, suh, svh, codebook_id):  # noqa: ANN001, ANN202
        assert x.dim() == 2 and x.is_contiguous()
        calls.append(("gemm", x.shape[0]))
        return ref.matmul(x, trellis, suh, svh, ref.CODEBOOKS[codebook_id])

    def supports(x, *_: object) -> bool:  # noqa: ANN001
        return 1 <= x.numel() // x.shape[-1] <= 8 and x.dtype == torch.float16

    def prefill_supports(x, *_: object) -> bool:  # noqa: ANN001
        return x.numel() // x.shape[-1] > 8 and x.dtype == torch.float16

    module = types.SimpleNamespace(
        available=lambda: True, gemv=gemv, gemm=gemm, supports=supports, prefill_supports=prefill_supports
    )
    module.calls = calls
    monkeypatch.setattr(ops, "_cuda_module", module)
    monkeypatch.setattr(ops, "_cuda_probed", True)
    return module


def test_op_sends_more_than_8_rows_to_the_prefill_path(op_kernel: types.SimpleNamespace) -> None:
    trellis, suh, svh = _layer(128, 256, 4, seed=4)
    x = torch.randn(3, 11, 128).half()  # 33 rows
    y = ops._exl3_gemm_cuda(x, trellis, suh, svh, 2)
    assert op_kernel.calls == [("gemm", 33)]
    assert y.shape == (3, 11, 256) and torch.equal(y, ref.matmul(x, trellis, suh, svh, "mul1"))
    ops._exl3_gemm_cuda(torch.randn(8, 128).half(), trellis, suh, svh, 2)
    ops._exl3_gemm_cuda(torch.randn(40, 128), trellis, suh, svh, 2)  # fp32: neither kernel, the reference
    assert op_kernel.calls == [("gemm", 33), ("gemv", 8)]
    with pytest.raises(ValueError, match="unsupported shape"):  # the reference's checks come first
        ops._exl3_gemm_cuda(torch.randn(40, 128).half(), trellis[:, :4], suh, svh[:64], 2)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_plugin_moe_prefill_maps_global_ids_and_matches_the_cpu_path(stand_in: StandIn) -> None:
    """vllm_plugin.forward._moe_prefill (what exl3_moe_forward runs on CUDA for prefill-sized calls): global expert
    ids of this rank mapped to its experts, other ranks' ids dropped; equal to the plugin's CPU path."""
    from sparkctl_exl3.vllm_plugin import forward

    experts_raw = _experts(128, 256, 3)

    def shard(p: tuple) -> forward.ShardWeights:
        return forward.ShardWeights(p[0], p[1], p[2], p[3], ref.bits_of(p[0]))

    experts = [forward.ExpertWeights(shard(e["gate"]), shard(e["up"]), shard(e["down"])) for e in experts_raw]
    expert_ids = [4, 7, 9]  # this rank's experts; 0..3, 5, 6, 8 belong to other ranks
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(30, 128, generator=gen)
    topk_ids = torch.tensor([4, 7, 9, 0, 5, 11], dtype=torch.int32)[
        torch.randint(0, 6, (30, 2), generator=gen)
    ]
    topk_weights = torch.rand(30, 2, generator=gen)
    kw = {"hidden": 128, "intermediate": 256, "activation": "silu"}
    expected = forward.exl3_moe_forward(x, topk_weights, topk_ids, experts, expert_ids, **kw)  # the CPU path
    y = forward._moe_prefill(x, topk_weights, topk_ids, experts, expert_ids, 128, 256, "silu")
    assert y is not None and y.dtype == x.dtype and y.shape == (30, 128)
    assert _rel(y, expected) < 5e-3
