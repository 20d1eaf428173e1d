"""kernels/bench/moe_bench.py's CPU half: the random experts and routings it feeds both MoE kernels, and the
reference it judges them by, held to the plugin's own routed-only MoE forward. The timings and the kernels
themselves need the GPU and run on the device."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from sparkctl_exl3 import reference
from sparkctl_exl3.vllm_plugin import forward

BENCH = Path(__file__).resolve().parents[2] / "kernels" / "bench"


def _load(name: str, filename: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mb():
    module = _load("kernels_bench_moe_bench", "moe_bench.py")
    yield module
    del sys.modules["kernels_bench_moe_bench"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.double(), b.double()
    assert torch.isfinite(a64).all() and torch.isfinite(b64).all()
    return float((a64 - b64).norm() / b64.norm())


def test_random_experts_are_valid_layers_of_the_requested_rates(mb) -> None:
    """Each projection passes the reference's own layer check at its K (mixed K and codebooks cycle per expert)."""
    bits = (1.0, 2.5, 4.0, 8.0, 3.5)
    cbs = ("mul1", "mul1", "mcg", "3inst", "mul1")
    experts = mb.random_experts(5, 256, 128, bits, cbs, seed=3, device="cpu")
    for e, expert in enumerate(experts):
        for proj, (i, o) in {"gate": (256, 128), "up": (256, 128), "down": (128, 256)}.items():
            trellis, suh, svh, cb = expert[proj]
            assert cb == cbs[e]
            assert tuple(trellis.shape[:2]) == (i // 16, o // 16) and trellis.dtype == torch.int16
            assert reference.check_layer(trellis, suh, svh, cb) == bits[e]
            assert suh.dtype == svh.dtype == torch.float16
            assert (suh > 0).any() and (suh < 0).any()  # random signs
            # suh ~ +-1, svh ~ +-1/sqrt(I): every projection keeps unit-scale activations in fp16
            assert 0.8 < float(suh.float().abs().mean()) < 1.2
            assert 0.8 < float(svh.float().abs().mean()) * i**0.5 < 1.2
    with pytest.raises(ValueError, match="mul1"):
        mb.random_projection(128, 128, 2.5, "mcg", torch.Generator().manual_seed(0), "cpu")
    with pytest.raises(ValueError, match="unsupported K"):
        mb.tile_length(9)


def test_random_routings(mb) -> None:
    gen = torch.Generator().manual_seed(5)
    for kind in mb.ROUTINGS:
        ids, w = mb.random_routing(300, 8, 64, kind, gen, "cpu")
        assert ids.dtype == torch.int32 and w.dtype == torch.float32 and ids.shape == w.shape == (300, 8)
        assert all(len(set(row)) == 8 for row in ids.tolist()), kind  # distinct experts per token, as top-k
        assert torch.allclose(w.sum(-1), torch.ones(300)) and (w > 0).all()
        assert int(ids.min()) >= 0 and int(ids.max()) < 64
        if kind == "dup":
            assert len(torch.unique(ids)) <= 10  # a pool of k + 2: tokens share experts
        if kind == "same":
            assert (ids == ids[:1]).all()
        if kind == "fat":
            assert int(torch.bincount(ids.reshape(-1).long())[0]) == 300  # > 256 rows on one expert
        if kind == "random":
            assert len(torch.unique(ids)) > 40
    with pytest.raises(ValueError, match="unknown routing"):
        mb.random_routing(2, 2, 8, "uniform", gen, "cpu")


def _stack(experts):
    def shard(t):
        trellis, suh, svh, cb = t
        return forward.ShardWeights(trellis, suh, svh, cb, reference.bits_of(trellis))

    weights = [forward.ExpertWeights(shard(e["gate"]), shard(e["up"]), shard(e["down"])) for e in experts]
    return forward.stack_experts(weights)


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
def test_reference_moe_is_the_plugins_routed_forward(mb, activation: str) -> None:
    """The bench's oracle equals the plugin's CPU MoE (gathered decode per (token, slot), index_add_) and a plain
    per-token loop, on a layer of mixed K and codebooks with experts shared across tokens."""
    hidden, inter, num = 128, 256, 6
    experts = mb.random_experts(
        num, hidden, inter, (2.0, 3.0, 1.5, 4.0), ("mul1", "mcg", "mul1", "3inst"), seed=11, device="cpu"
    )
    gen = torch.Generator().manual_seed(2)
    ids, w = mb.random_routing(5, 3, num, "dup", gen, "cpu")
    x = torch.randn(5, hidden, generator=gen).half()
    y = mb.reference_moe(x, ids, w, experts, activation)
    assert y.dtype == torch.float16 and y.shape == (5, hidden)
    routed = forward._moe_routed(
        x,
        w,
        ids,
        _stack(experts),
        range(num),
        hidden=hidden,
        intermediate=inter,
        activation=activation,
        apply_router_weight_on_input=False,
    )
    assert _rel(y, routed) < 1e-3
    act = mb.ACTIVATIONS[activation]
    loop = torch.zeros(5, hidden)
    for t in range(5):
        for slot in range(3):
            e = experts[int(ids[t, slot])]
            xt = x[t : t + 1]
            h = act(reference.matmul(xt, *e["gate"]).float()) * reference.matmul(xt, *e["up"]).float()
            loop[t] += float(w[t, slot]) * reference.matmul(h.half(), *e["down"]).float()[0]
    assert _rel(y, loop) < 1e-3
    assert (
        0.05 < float(y.float().abs().mean()) < 20
    )  # unit-scale outputs: neither zero nor near fp16 overflow


def test_reference_moe_drops_ids_it_does_not_hold(mb) -> None:
    """Ids outside the layer (another rank's experts) add nothing, as in the plugin's forward."""
    experts = mb.random_experts(3, 128, 128, 2.0, "mul1", seed=1, device="cpu")
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(0)).half()
    ids = torch.tensor([[0, 3], [-1, 2]], dtype=torch.int32)
    w = torch.tensor([[0.5, 0.5], [0.25, 0.75]])
    held = mb.reference_moe(x, ids, w, experts)
    only = mb.reference_moe(
        x, torch.tensor([[0, 0], [2, 2]]), torch.tensor([[0.5, 0.0], [0.0, 0.75]]), experts
    )
    assert torch.equal(held, only)


def test_active_bytes_counts_unique_routed_experts(mb) -> None:
    experts = mb.random_experts(4, 256, 128, (2.0, 4.0), "mul1", seed=0, device="cpu")
    per = {2.0: 0, 4.0: 0}
    for bits in per:
        # gate, up: 256x128; down: 128x256; trellis K/8 bytes per weight, suh/svh fp16
        per[bits] = 3 * (256 * 128 * bits / 8) + 3 * 2 * (256 + 128)
    ids = torch.tensor([[0, 1], [1, 0], [0, 3]])
    assert mb.active_bytes(ids, experts) == per[2.0] + per[4.0] + per[4.0]


def test_moe_bench_needs_cuda(mb, monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mb.main(["--out", "unused"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_peer_without_exllamav3_is_one_line(monkeypatch) -> None:
    """Where exllamav3 cannot be imported, the peer says so in one line and the bench's other side still runs."""
    peer = _load("kernels_bench_peer_exllamav3", "peer_exllamav3.py")
    try:
        monkeypatch.setitem(sys.modules, "exllamav3", None)  # import raises ImportError
        with pytest.raises(peer.PeerUnavailable, match=r"^exllamav3 1\.6\.5 unavailable: ") as info:
            peer.load()
        assert "\n" not in str(info.value)
        assert peer.info() == {"error": str(info.value)}
        with pytest.raises(peer.PeerUnavailable):  # remembered, not retried
            peer.load()
    finally:
        del sys.modules["kernels_bench_peer_exllamav3"]


class _FakeKernel:
    """Stands in for sparkctl_exl3.cuda's MoE entry points: the reference itself, or the reference with one expert's
    contribution lost (a kernel that drops a routed expert)."""

    def __init__(self, mb, broken: bool) -> None:
        self.mb, self.broken = mb, broken

    def moe_supports(self, experts):
        return all(e["gate"][3] == "mul1" for e in experts)

    def moe_prepare(self, experts, expert_ids=None):
        return list(experts)

    def moe(self, x, topk_ids, topk_weights, tables, activation="silu"):
        if self.broken:
            topk_weights = torch.where(topk_ids == topk_ids[0, 0], 0.0, topk_weights)
        return self.mb.reference_moe(x, topk_ids, topk_weights, tables, activation)


@pytest.mark.parametrize("broken", [False, True])
def test_checker_passes_a_right_kernel_and_fails_a_wrong_one(mb, broken: bool) -> None:
    """The bench's check plumbing (routing, poisoned output, error against the reference) on the CPU."""
    ours = mb.Ours.__new__(mb.Ours)
    ours.reason, ours.cuda = None, _FakeKernel(mb, broken)
    lines: list[str] = []
    chk = mb.Checker(ours, mb.Peer(False), lines.append)
    experts = mb.random_experts(4, 128, 128, 2.0, "mul1", seed=9, device="cpu")
    chk.layer("tiny", experts, 2, [(3, "dup"), (9, "fat")], torch.Generator().manual_seed(4))
    assert [c.who for c in chk.results] == ["ours", "ours"]
    assert all(c.ok for c in chk.results) is not broken
    assert all(("FAIL" in line) is broken for line in lines)


def test_checker_says_n_a_for_layers_the_fused_moe_does_not_take(mb) -> None:
    ours = mb.Ours.__new__(mb.Ours)
    ours.reason, ours.cuda = None, _FakeKernel(mb, False)
    lines: list[str] = []
    chk = mb.Checker(ours, mb.Peer(False), lines.append)
    experts = mb.random_experts(4, 128, 128, 2.0, "mcg", seed=9, device="cpu")
    chk.layer("tiny", experts, 2, [(3, "dup")], torch.Generator().manual_seed(4))
    assert chk.results == []  # not run, and not a failure
    assert any("n/a" in line for line in lines)
