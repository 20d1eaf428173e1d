"""vLLM's own layer classes with the exl3 plugin, on the CPU: registration, loading through vLLM's loaders
(fused q/k/v and gate/up shards, tensor-parallel cuts, per-expert MoE tensors), forward equal to the
reference decoder, and the errors a bad checkpoint gets."""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sparkctl_exl3 import checkpoint, reference

pytestmark = pytest.mark.vllm

HIDDEN = 256


def _layer(
    i: int, o: int, bits: float, codebook: str, seed: int, bias: bool = False
) -> dict[str, torch.Tensor]:
    return checkpoint.random_exl3_layer(i, o, bits, codebook, torch.Generator().manual_seed(seed), bias=bias)


def _ref(x: torch.Tensor, g: dict[str, torch.Tensor]) -> torch.Tensor:
    y = reference.matmul(x, g["trellis"], g["suh"], g["svh"], reference.codebook_of(g))
    return y + g["bias"].float() if "bias" in g else y


def _config(packed: bool = True) -> object:
    from sparkctl_exl3.vllm_plugin.config import EXL3Config

    cfg = EXL3Config.from_config({"quant_method": "exl3", "bits": 4.0, "head_bits": 6, "codebook": "mul1"})
    if packed:  # what LlamaForCausalLM puts there when vLLM builds the model
        cfg.packed_modules_mapping = {
            "qkv_proj": ["q_proj", "k_proj", "v_proj"],
            "gate_up_proj": ["gate_proj", "up_proj"],
        }
    return cfg


def _load(module: torch.nn.Module, weights: dict[str, dict[str, torch.Tensor]]) -> set[str]:
    """Load checkpoint-named tensors exactly as vLLM's Llama does (AutoWeightsLoader + the Llama name mapper)."""
    from vllm.model_executor.models.llama import LlamaModel
    from vllm.model_executor.models.utils import AutoWeightsLoader

    flat = [(f"{p}.{n}", t.clone()) for p, g in weights.items() for n, t in g.items()]
    return AutoWeightsLoader(module).load_weights(flat, mapper=LlamaModel.hf_to_vllm_mapper)


def _finish(*layers: torch.nn.Module) -> None:
    for layer in layers:
        layer.quant_method.process_weights_after_loading(layer)


# ------------------------------------------------------------------------------------------------
# registration
# ------------------------------------------------------------------------------------------------


def test_entry_point_and_idempotent_registration(vllm_env: object) -> None:
    from importlib.metadata import entry_points

    from sparkctl_exl3.vllm_plugin import is_registered, register
    from sparkctl_exl3.vllm_plugin.config import EXL3Config
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
    from vllm.plugins import load_general_plugins

    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("exl3") == "sparkctl_exl3.vllm_plugin:register"
    load_general_plugins()
    register()
    register()
    assert is_registered()
    assert get_quantization_config("exl3") is EXL3Config
    assert QUANTIZATION_METHODS.count("exl3") == 1
    assert hasattr(torch.ops.sparkctl_exl3, "exl3_gemm")


def test_config_from_checkpoint(vllm_env: object, tiny_models: dict[str, Path]) -> None:
    from sparkctl_exl3.vllm_plugin.config import EXL3Config
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    raw = json.loads((tiny_models["dense"] / "config.json").read_text())["quantization_config"]
    cfg = EXL3Config.from_config(raw)
    assert isinstance(cfg, QuantizationConfig) and cfg.get_name() == "exl3"
    assert (
        torch.float32 in cfg.get_supported_act_dtypes() and torch.bfloat16 in cfg.get_supported_act_dtypes()
    )
    cfg.maybe_update_config(str(tiny_models["dense"]))
    assert cfg.index is not None and "lm_head" in cfg.index.exl3 and "model.embed_tokens" in cfg.index.plain
    with pytest.raises(ValueError, match="quant_method 'gptq'"):
        EXL3Config.from_config({"quant_method": "gptq"})


def test_checkpoint_that_lacks_exl3_tensors(
    vllm_env: object, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """A plain checkpoint whose config says exl3 fails at startup with one clear sentence."""
    from sparkctl_exl3.vllm_plugin.config import EXL3Config

    fake = tmp_path / "fake-exl3"
    shutil.copytree(tiny_models["dense-twin"], fake)
    cfg = EXL3Config.from_config({"quant_method": "exl3"})
    with pytest.raises(
        ValueError, match="declares quant_method exl3 but no safetensors file holds an EXL3 tensor"
    ):
        cfg.maybe_update_config(str(fake))


# ------------------------------------------------------------------------------------------------
# dense linears
# ------------------------------------------------------------------------------------------------


class _Block(torch.nn.Module):
    """A Llama decoder block's linears under the names vLLM gives them."""

    def __init__(
        self, cfg: object, head_dim: int = 64, heads: int = 4, kv_heads: int = 2, inter: int = 512
    ) -> None:
        from vllm.model_executor.layers.linear import (
            MergedColumnParallelLinear,
            QKVParallelLinear,
            RowParallelLinear,
        )

        super().__init__()
        attn, mlp = torch.nn.Module(), torch.nn.Module()
        attn.qkv_proj = QKVParallelLinear(
            HIDDEN,
            head_dim,
            heads,
            kv_heads,
            bias=True,
            quant_config=cfg,
            prefix="l.self_attn.qkv_proj",
            params_dtype=torch.float32,
        )
        attn.o_proj = RowParallelLinear(
            heads * head_dim,
            HIDDEN,
            bias=True,
            quant_config=cfg,
            prefix="l.self_attn.o_proj",
            params_dtype=torch.float32,
        )
        mlp.gate_up_proj = MergedColumnParallelLinear(
            HIDDEN,
            [inter, inter],
            bias=False,
            quant_config=cfg,
            prefix="l.mlp.gate_up_proj",
            params_dtype=torch.float32,
        )
        mlp.down_proj = RowParallelLinear(
            inter, HIDDEN, bias=False, quant_config=cfg, prefix="l.mlp.down_proj", params_dtype=torch.float32
        )
        self.self_attn, self.mlp = attn, mlp


def _block_weights(
    head_dim: int = 64, heads: int = 4, kv_heads: int = 2, inter: int = 512
) -> dict[str, dict[str, torch.Tensor]]:
    q, kv = heads * head_dim, kv_heads * head_dim
    return {
        "self_attn.q_proj": _layer(HIDDEN, q, 4, "mul1", 1, bias=True),
        "self_attn.k_proj": _layer(HIDDEN, kv, 3, "mcg", 2, bias=True),
        "self_attn.v_proj": _layer(HIDDEN, kv, 2.5, "mul1", 3, bias=True),
        "self_attn.o_proj": _layer(q, HIDDEN, 5, "3inst", 4, bias=True),
        "mlp.gate_proj": _layer(HIDDEN, inter, 2, "3inst", 5),
        "mlp.up_proj": _layer(HIDDEN, inter, 6, "mcg", 6),
        "mlp.down_proj": _layer(inter, HIDDEN, 4, "mul1", 7),
    }


def test_fused_shards_load_and_forward(vllm_env: object) -> None:
    block = _Block(_config())
    w = _block_weights()
    loaded = _load(block, w)
    assert "self_attn.qkv_proj.trellis" in loaded and "mlp.gate_up_proj.mcg" in loaded
    attn, mlp = block.self_attn, block.mlp
    _finish(attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    # each fused shard kept its own K and codebook
    assert attn.qkv_proj.exl3_bits == [4.0, 3.0, 2.5] and attn.qkv_proj.exl3_codebooks == [
        "mul1",
        "mcg",
        "mul1",
    ]
    assert mlp.gate_up_proj.exl3_codebooks == ["3inst", "mcg"]

    x = torch.randn(7, HIDDEN, generator=torch.Generator().manual_seed(9))
    qkv, _ = attn.qkv_proj(x)
    expected = torch.cat([_ref(x, w[f"self_attn.{n}_proj"]) for n in "qkv"], dim=-1)
    torch.testing.assert_close(qkv, expected, rtol=1e-5, atol=1e-5)
    gate_up, _ = mlp.gate_up_proj(x)
    torch.testing.assert_close(
        gate_up, torch.cat([_ref(x, w["mlp.gate_proj"]), _ref(x, w["mlp.up_proj"])], -1)
    )
    h = torch.randn(3, 512, generator=torch.Generator().manual_seed(10))
    down, _ = mlp.down_proj(h)
    torch.testing.assert_close(down, _ref(h, w["mlp.down_proj"]))
    o, _ = attn.o_proj(x)
    torch.testing.assert_close(o, _ref(x, w["self_attn.o_proj"]))  # bias added once

    # vLLM compiles the model with Dynamo (fullgraph): apply must trace without a graph break, the EXL3 op
    # staying opaque, for any batch size
    layer = attn.qkv_proj
    compiled = torch.compile(
        lambda t: layer.quant_method.apply(layer, t, layer.bias),
        fullgraph=True,
        backend="eager",
        dynamic=True,
    )
    for rows in (1, 7):
        xr = x[:rows].contiguous()
        torch.testing.assert_close(compiled(xr), expected[:rows], rtol=1e-5, atol=1e-5)


@pytest.fixture
def fake_tp(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Pretend to be rank r of a 2-way tensor-parallel group while vLLM's linear layers are built."""
    import vllm.model_executor.layers.linear as linear

    def set_rank(rank: int, size: int = 2) -> None:
        monkeypatch.setattr(linear, "get_tensor_model_parallel_rank", lambda: rank)
        monkeypatch.setattr(linear, "get_tensor_model_parallel_world_size", lambda: size)

    yield set_rank


def test_tensor_parallel_cuts_reassemble_the_layer(vllm_env: object, fake_tp) -> None:
    """Two ranks' column shards concatenate, and their row partials sum, to the full layer."""
    kw = {"head_dim": 128, "heads": 4, "kv_heads": 2, "inter": 512}
    w = _block_weights(**kw)
    ranks = []
    for rank in (0, 1):
        fake_tp(rank)
        block = _Block(_config(), **kw)
        _load(block, w)
        _finish(block.self_attn.qkv_proj, block.self_attn.o_proj, block.mlp.gate_up_proj, block.mlp.down_proj)
        ranks.append(block)
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(11))

    def col(block: _Block, layer: str) -> torch.Tensor:
        mod = block.get_submodule(layer)
        return mod.quant_method.apply(mod, x, mod.bias)

    # q/k/v: each rank holds half of every shard, in shard order
    q0, k0, v0 = col(ranks[0], "self_attn.qkv_proj").split([256, 128, 128], dim=-1)
    q1, k1, v1 = col(ranks[1], "self_attn.qkv_proj").split([256, 128, 128], dim=-1)
    torch.testing.assert_close(torch.cat([q0, q1], -1), _ref(x, w["self_attn.q_proj"]))
    torch.testing.assert_close(torch.cat([k0, k1], -1), _ref(x, w["self_attn.k_proj"]))
    torch.testing.assert_close(torch.cat([v0, v1], -1), _ref(x, w["self_attn.v_proj"]))
    g0, u0 = col(ranks[0], "mlp.gate_up_proj").split(256, dim=-1)
    g1, u1 = col(ranks[1], "mlp.gate_up_proj").split(256, dim=-1)
    torch.testing.assert_close(torch.cat([g0, g1], -1), _ref(x, w["mlp.gate_proj"]))
    torch.testing.assert_close(torch.cat([u0, u1], -1), _ref(x, w["mlp.up_proj"]))
    # o_proj: rank r sees input columns [256 r, 256 r + 256); bias only on rank 0 (as RowParallelLinear does)
    xo = torch.randn(5, 512, generator=torch.Generator().manual_seed(12))
    parts = []
    for rank, block in enumerate(ranks):
        mod = block.self_attn.o_proj
        parts.append(
            mod.quant_method.apply(mod, xo[:, 256 * rank : 256 * rank + 256], mod.bias if rank == 0 else None)
        )
    torch.testing.assert_close(parts[0] + parts[1], _ref(xo, w["self_attn.o_proj"]), rtol=1e-4, atol=1e-4)


def test_cut_for_rank_row_and_column(vllm_env: object) -> None:
    """The one cut both loaders use: row cuts trellis dim 0 and suh, column cuts trellis dim 1 and svh."""
    from sparkctl_exl3.vllm_plugin.linear import Exl3LoadError, cut_for_rank

    trellis = torch.arange(32 * 16 * 48, dtype=torch.int16).reshape(32, 16, 48)  # I=512, O=256, K=3
    suh, svh, mcg = torch.arange(512.0), torch.arange(256.0), torch.tensor(7, dtype=torch.int32)
    row = {"split": "row", "part": 256, "rank": 1, "tp_size": 2}
    col = {"split": "column", "part": 128, "rank": 1, "tp_size": 2}
    assert torch.equal(cut_for_rank("l", "trellis", trellis, **row), trellis[16:32])
    assert torch.equal(cut_for_rank("l", "suh", suh, **row), suh[256:])
    assert cut_for_rank("l", "svh", svh, **row) is svh
    assert torch.equal(cut_for_rank("l", "trellis", trellis, **col), trellis[:, 8:16])
    assert torch.equal(cut_for_rank("l", "svh", svh, **col), svh[128:])
    assert cut_for_rank("l", "suh", suh, **col) is suh
    assert cut_for_rank("l", "mcg", mcg, **col) is mcg
    assert cut_for_rank("l", "trellis", trellis, **{**row, "rank": 0, "tp_size": 1}) is trellis
    with pytest.raises(Exl3LoadError, match=r"l\.trellis: expected 3 dims"):
        cut_for_rank("l", "trellis", trellis[0], **{**row, "tp_size": 1})


def test_unaligned_tensor_parallel_cut_is_refused(vllm_env: object, fake_tp) -> None:
    from sparkctl_exl3.vllm_plugin.storage import ShardCutError

    fake_tp(1)
    with pytest.raises(ShardCutError, match=r"l\.self_attn\.k_proj: tensor-parallel cut at output column 64"):
        _Block(_config())  # head_dim 64, 2 kv heads over 2 ranks: 64-wide k/v cuts


def test_missing_tensor_names_the_layer(vllm_env: object) -> None:
    from sparkctl_exl3.vllm_plugin.linear import Exl3LoadError

    block = _Block(_config())
    w = _block_weights()
    del w["self_attn.v_proj"]["svh"]
    _load(block, w)
    with pytest.raises(Exl3LoadError, match=r"l\.self_attn\.v_proj: .*lacks l\.self_attn\.v_proj\.svh"):
        _finish(block.self_attn.qkv_proj)


def test_unknown_codebook_marker(vllm_env: object) -> None:
    from sparkctl_exl3.vllm_plugin.linear import Exl3LoadError

    block = _Block(_config())
    w = _block_weights()
    w["self_attn.k_proj"]["mcg"] = torch.tensor(0x12345678, dtype=torch.int32)
    _load(block, w)
    with pytest.raises(
        Exl3LoadError, match=r"l\.self_attn\.k_proj: unknown mcg codebook marker value 0x12345678"
    ):
        _finish(block.self_attn.qkv_proj)


# ------------------------------------------------------------------------------------------------
# lm_head and embeddings
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [640, 1030])
def test_quantized_lm_head(vllm_env: object, vocab: int) -> None:
    """vLLM pads the vocab to 64, EXL3 to 128: the head is cut back to vLLM's width and matches the reference."""
    from sparkctl_exl3.vllm_plugin.linear import EXL3LinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    head = ParallelLMHead(vocab, HIDDEN, quant_config=_config(), prefix="lm_head", params_dtype=torch.float32)
    assert isinstance(head.quant_method, EXL3LinearMethod)
    g = _layer(HIDDEN, -(-vocab // 128) * 128, 6, "mul1", 21)
    holder = torch.nn.Module()
    holder.lm_head = head
    _load(holder, {"lm_head": g})
    _finish(head)
    x = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(22))
    logits = head.quant_method.apply(head, x)
    assert logits.shape == (4, head.num_embeddings_per_partition)
    torch.testing.assert_close(logits[:, :vocab], _ref(x, g)[:, :vocab])


def test_checkpoint_names_are_mapped_once(vllm_env: object) -> None:
    """vLLM's name mapper runs over the whole index once, not once per layer asking (start-up time)."""
    from sparkctl_exl3.vllm_plugin import storage
    from sparkctl_exl3.vllm_plugin.config import EXL3Config

    calls = []

    class Mapper:
        def apply_list(self, names: list[str]) -> list[str]:
            calls.append(len(names))
            return [n.removeprefix("hf.") for n in names]

    cfg = EXL3Config()
    cfg.index = storage.CheckpointIndex(
        exl3={"hf.a.q_proj", "hf.a.experts.0.w1"}, plain={"hf.a.gate"}, files=1
    )
    cfg.apply_vllm_mapper(Mapper())
    for _ in range(3):
        assert cfg._storage_of("a.q_proj", ["a.q_proj"]) == "exl3"
        assert cfg._storage_of("a.gate", ["a.gate"]) == "plain"
        assert cfg._storage_of("a.v_proj", ["a.v_proj"]) is None
        assert cfg._experts_storage("a.experts") == "exl3"
    assert cfg._storage_of("hf.a.gate", ["hf.a.gate"]) == "plain"  # the checkpoint's own names count too
    assert calls == [2, 1]


def test_embeddings_and_plain_modules_stay_unquantized(
    vllm_env: object, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from vllm.model_executor.layers.linear import ReplicatedLinear, UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    cfg = _config()
    cfg.maybe_update_config(str(tiny_models["dense"]))
    emb = VocabParallelEmbedding(640, HIDDEN, quant_config=cfg, prefix="model.embed_tokens")
    assert isinstance(emb.quant_method, UnquantizedEmbeddingMethod)
    # a module the checkpoint stores as .weight (here: a router-like gate) gets vLLM's unquantized method
    cfg.index.plain.add("model.layers.0.mlp.gate")
    gate = ReplicatedLinear(HIDDEN, 4, bias=False, quant_config=cfg, prefix="model.layers.0.mlp.gate")
    assert isinstance(gate.quant_method, UnquantizedLinearMethod)
    cfg.index.exl3.discard("lm_head")
    cfg.index.plain.add("lm_head")
    head = ParallelLMHead(640, HIDDEN, quant_config=cfg, prefix="lm_head")
    assert isinstance(head.quant_method, UnquantizedEmbeddingMethod)


# ------------------------------------------------------------------------------------------------
# MoE
# ------------------------------------------------------------------------------------------------


def _moe_weights(experts: int = 4, inter: int = 256) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    seed = 100
    for e in range(experts):
        for proj, (i, o) in (("w1", (HIDDEN, inter)), ("w3", (HIDDEN, inter)), ("w2", (inter, HIDDEN))):
            bits = (2, 3, 4, 5)[(e + len(proj) + seed) % 4]
            out[f"block_sparse_moe.experts.{e}.{proj}"] = _layer(i, o, bits, ("mcg", "mul1")[e % 2], seed)
            seed += 1
    return out


def _expert_ref(x: torch.Tensor, w: dict[str, dict[str, torch.Tensor]], e: int) -> torch.Tensor:
    p = f"block_sparse_moe.experts.{e}"
    h = torch.nn.functional.silu(_ref(x, w[f"{p}.w1"])) * _ref(x, w[f"{p}.w3"])
    return _ref(h, w[f"{p}.w2"])


_MOE_LAYER_IDS = itertools.count()


def _moe_holder(tp_size: int | None = None) -> torch.nn.Module:
    """A Mixtral-style sparse MoE block (vLLM's fused-MoE runner) under the checkpoint's names."""
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory

    holder, moe = torch.nn.Module(), torch.nn.Module()
    moe.experts = FusedMoEFactory(
        num_experts=4,
        top_k=2,
        hidden_size=HIDDEN,
        intermediate_size=256,
        params_dtype=torch.float32,
        quant_config=_config(),
        tp_size=tp_size,
        prefix=f"model.layers.{next(_MOE_LAYER_IDS)}.block_sparse_moe.experts",  # vLLM refuses duplicate names
        ckpt_names=("w1", "w2", "w3"),
    )
    holder.block_sparse_moe = moe
    return holder


def _load_moe(holder: torch.nn.Module, w: dict[str, dict[str, torch.Tensor]]) -> set[str]:
    from vllm.model_executor.models.mixtral import MixtralModel
    from vllm.model_executor.models.utils import AutoWeightsLoader

    flat = [(f"{p}.{n}", t.clone()) for p, g in w.items() for n, t in g.items()]
    return AutoWeightsLoader(holder).load_weights(flat, mapper=MixtralModel.hf_to_vllm_mapper)


def test_moe_per_expert_load_and_forward(vllm_env: object) -> None:
    """Per-expert EXL3 tensors go through vLLM's RoutedExperts.load_weights; apply = top-k weighted reference."""
    from sparkctl_exl3.vllm_plugin.moe import EXL3MoEMethod

    holder = _moe_holder()
    routed = holder.block_sparse_moe.experts.routed_experts
    assert isinstance(routed.quant_method, EXL3MoEMethod)
    w = _moe_weights()
    loaded = _load_moe(holder, w)
    assert any(n.endswith("w13_trellis") for n in loaded) and any(n.endswith("w2_mul1") for n in loaded)
    routed.quant_method.process_weights_after_loading(routed)
    assert routed.exl3_expert_ids == [0, 1, 2, 3]

    tokens = 6
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(31))
    topk_ids = torch.tensor([[0, 1], [2, 3], [3, 0], [1, 2], [0, 3], [2, 1]], dtype=torch.int32)
    topk_weights = torch.softmax(torch.randn(tokens, 2, generator=torch.Generator().manual_seed(32)), -1)
    y = routed.quant_method.apply(routed, x, topk_weights, topk_ids, None, None)
    expected = torch.stack(
        [
            sum(topk_weights[t, k] * _expert_ref(x[t : t + 1], w, int(topk_ids[t, k]))[0] for k in range(2))
            for t in range(tokens)
        ]
    )
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
    method = routed.quant_method
    compiled = torch.compile(
        lambda a, b, c: method.apply(routed, a, b, c, None, None),
        fullgraph=True,
        backend="eager",
        dynamic=True,
    )
    torch.testing.assert_close(compiled(x, topk_weights, topk_ids), expected, rtol=1e-4, atol=1e-4)
    # the expert list is read from the buffers once (the eager prefill asks every call), again once they change
    kept = method.expert_weights(routed)
    assert method.expert_weights(routed) is kept
    routed._buffers["exl3_e0_gate_trellis"] = routed.exl3_e0_gate_trellis.clone()
    fresh = method.expert_weights(routed)
    assert fresh is not kept and fresh[0].gate.trellis is routed.exl3_e0_gate_trellis
    assert routed.exl3_prefill is None  # the CUDA prefill's tables: CUDA layers only


def test_named_expert_loading_loads_what_vllm_loads(vllm_env: object) -> None:
    """compat.load_named_experts (the loader vLLM before 0.32 gets, where its own misreads a 3-D per-expert trellis
    as all experts) yields the same parameters and leaves the same expert tensors as vLLM 0.32's own loader."""
    from sparkctl_exl3.vllm_plugin import compat

    w = _moe_weights()
    layers = []
    for ours in (False, True):
        holder = _moe_holder()
        routed = holder.block_sparse_moe.experts.routed_experts
        if ours:
            compat.use_named_expert_loading(routed, always=True)
            assert routed.load_weights.__func__ is compat.load_named_experts
        loaded = _load_moe(holder, w)
        routed.quant_method.process_weights_after_loading(routed)
        layers.append((loaded, routed))
    (vllm_names, vllm_layer), (our_names, our_layer) = layers
    assert our_names == vllm_names
    assert our_layer.exl3_expert_ids == vllm_layer.exl3_expert_ids == [0, 1, 2, 3]
    ours_buf, vllm_buf = dict(our_layer.named_buffers()), dict(vllm_layer.named_buffers())
    assert ours_buf.keys() == vllm_buf.keys() and any("_down_trellis" in k for k in ours_buf)
    for k, t in vllm_buf.items():
        assert torch.equal(ours_buf[k], t), k
    assert our_layer.exl3_expert_meta == vllm_layer.exl3_expert_meta


def test_moe_forward_has_no_host_sync(vllm_env: object) -> None:
    """exl3_moe_forward traces under FakeTensorMode: an .item(), .cpu() or a Python branch on routing values
    would raise there (data-dependent output), so the decode path never waits for the device."""
    from sparkctl_exl3.vllm_plugin.forward import ExpertWeights, ShardWeights, exl3_moe_forward
    from torch._subclasses.fake_tensor import FakeTensorMode

    w = _moe_weights(experts=2)

    # codebook and K are decided from the real tensors at load time; the forward only sees fake ones
    meta = {p: (reference.codebook_of(g), reference.bits_of(g["trellis"])) for p, g in w.items()}

    def shard(p: str, mode: FakeTensorMode) -> ShardWeights:
        return ShardWeights(*(mode.from_tensor(w[p][n]) for n in ("trellis", "suh", "svh")), *meta[p])

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        experts = [
            ExpertWeights(*(shard(f"block_sparse_moe.experts.{e}.{p}", mode) for p in ("w1", "w3", "w2")))
            for e in range(2)
        ]
        x = torch.empty(3, HIDDEN)
        out = exl3_moe_forward(
            x,
            torch.empty(3, 2),
            torch.empty(3, 2, dtype=torch.int32),
            experts,
            [0, 1],
            hidden=HIDDEN,
            intermediate=256,
            activation="silu",
        )
        assert out.shape == (3, HIDDEN)


def _moe_experts(w: dict[str, dict[str, torch.Tensor]], count: int) -> list:
    from sparkctl_exl3.vllm_plugin.forward import ExpertWeights, ShardWeights

    def shard(p: str) -> ShardWeights:
        g = w[p]
        return ShardWeights(
            g["trellis"], g["suh"], g["svh"], reference.codebook_of(g), reference.bits_of(g["trellis"])
        )

    return [
        ExpertWeights(*(shard(f"block_sparse_moe.experts.{e}.{p}") for p in ("w1", "w3", "w2")))
        for e in range(count)
    ]


def _moe_expected(x, topk_weights, topk_ids, w, expert_ids) -> torch.Tensor:
    """The top-k weighted sum computed pair by pair from the reference (ids this rank does not hold add nothing)."""
    out = torch.zeros(x.shape[0], HIDDEN)
    for t in range(x.shape[0]):
        for k in range(topk_ids.shape[1]):
            gid = int(topk_ids[t, k])
            if gid in expert_ids:
                out[t] += topk_weights[t, k] * _expert_ref(x[t : t + 1], w, expert_ids.index(gid))[0]
    return out


def test_moe_cpu_computes_only_routed_experts(vllm_env: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU path decodes top_k experts per token, never the unrouted ones: an unrouted expert whose scales are NaN
    leaves every output finite, and the decode count is the number of (token, slot) pairs, not the local experts."""
    from sparkctl_exl3 import reference as ref_module
    from sparkctl_exl3.vllm_plugin.forward import exl3_moe_forward

    w = _moe_weights(experts=4)  # mixed K (2..5) and codebooks (mcg, mul1) across experts
    poisoned = {p: dict(g) for p, g in w.items()}
    for proj in ("w1", "w3", "w2"):  # expert 3 is routed to by no token below
        g = poisoned[f"block_sparse_moe.experts.3.{proj}"]
        g["suh"] = torch.full_like(g["suh"], float("nan"))
        g["svh"] = torch.full_like(g["svh"], float("nan"))
    experts = _moe_experts(poisoned, 4)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, HIDDEN, generator=gen)
    # duplicate ids across tokens, two tokens on the same pair of experts, expert 3 nowhere
    topk_ids = torch.tensor([[0, 2], [2, 0], [1, 1]], dtype=torch.int32)
    topk_weights = torch.softmax(torch.randn(3, 2, generator=gen), -1)

    decoded: list[int] = []
    real = ref_module.matmul_gathered

    def counting(xg, trellis, *args, **kwargs):
        decoded.append(int(xg.shape[0]))
        return real(xg, trellis, *args, **kwargs)

    monkeypatch.setattr(ref_module, "matmul_gathered", counting)
    kwargs = dict(hidden=HIDDEN, intermediate=256, activation="silu")
    y = exl3_moe_forward(x, topk_weights, topk_ids, experts, [0, 1, 2, 3], **kwargs)
    assert torch.isfinite(y).all(), "an unrouted (NaN-poisoned) expert reached the output"
    assert decoded == [6, 6, 6]  # gate, up, down: one decode per (token, slot) pair
    torch.testing.assert_close(
        y, _moe_expected(x, topk_weights, topk_ids, w, [0, 1, 2, 3]), rtol=1e-4, atol=1e-4
    )

    # routed to the poisoned expert: its NaN must show, in exactly the tokens that chose it
    y3 = exl3_moe_forward(
        x,
        topk_weights,
        torch.tensor([[0, 2], [3, 0], [1, 1]], dtype=torch.int32),
        experts,
        [0, 1, 2, 3],
        **kwargs,
    )
    assert torch.isfinite(y3[0]).all() and torch.isfinite(y3[2]).all() and not torch.isfinite(y3[1]).all()


def test_moe_cpu_expert_parallel_ids_add_nothing(vllm_env: object) -> None:
    """Ids of experts another rank holds (and an id past the table) contribute nothing, and the local expert the gather
    falls back to for them cannot leak into the output even when its weights are NaN."""
    from sparkctl_exl3.vllm_plugin.forward import exl3_moe_forward

    w = _moe_weights(experts=2)
    experts = _moe_experts(w, 2)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(4, HIDDEN, generator=gen)
    expert_ids = [10, 11]  # this rank holds global experts 10 and 11
    topk_ids = torch.tensor([[10, 3], [11, 10], [4, 5], [99, 11]], dtype=torch.int32)
    topk_weights = torch.softmax(torch.randn(4, 2, generator=gen), -1)
    kwargs = dict(hidden=HIDDEN, intermediate=256, activation="silu")
    y = exl3_moe_forward(x, topk_weights, topk_ids, experts, expert_ids, **kwargs)
    torch.testing.assert_close(
        y, _moe_expected(x, topk_weights, topk_ids, w, expert_ids), rtol=1e-4, atol=1e-4
    )
    assert torch.equal(y[2], torch.zeros(HIDDEN))
    # the weight on the input (Llama-4 style) goes through the same gather
    y_in = exl3_moe_forward(
        x, topk_weights, topk_ids, experts, expert_ids, apply_router_weight_on_input=True, **kwargs
    )
    assert torch.isfinite(y_in).all() and torch.equal(y_in[2], torch.zeros(HIDDEN))


@pytest.mark.parametrize("flag", [None, "exl3"])
def test_vllm_selects_exl3_from_config_or_flag(
    vllm_env: object, tiny_models: dict[str, Path], flag: str | None
) -> None:
    """`quant_method: exl3` in config.json alone, or `--quantization exl3`, both resolve to the plugin."""
    from vllm.engine.arg_utils import EngineArgs

    model_config = EngineArgs(
        model=str(tiny_models["dense"]), dtype="float32", quantization=flag
    ).create_model_config()
    assert model_config.quantization == "exl3"


def test_moe_tensor_parallel_cut(vllm_env: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """With TP=2 each rank holds half of every expert's intermediate dim (gate/up columns, down rows); the two
    ranks' partial outputs (vLLM all-reduces them) sum to the full MoE output."""
    import vllm.model_executor.layers.fused_moe.config as moe_config

    w = _moe_weights()
    x = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(41))
    topk_ids = torch.tensor([[0, 1], [2, 3], [3, 0], [1, 2]], dtype=torch.int32)
    topk_weights = torch.full((4, 2), 0.5)
    partials = []
    for rank in (0, 1):
        monkeypatch.setattr(moe_config, "get_tensor_model_parallel_rank", lambda rank=rank: rank)
        holder = _moe_holder(tp_size=2)
        routed = holder.block_sparse_moe.experts.routed_experts
        assert routed.exl3_plan.intermediate == 128 and routed.exl3_plan.tp_rank == rank
        _load_moe(holder, w)
        routed.quant_method.process_weights_after_loading(routed)
        assert (
            routed.exl3_e0_gate_trellis.shape[1] == 128 // 16
            and routed.exl3_e0_down_trellis.shape[0] == 128 // 16
        )
        partials.append(routed.quant_method.apply(routed, x, topk_weights, topk_ids, None, None))
    expected = torch.stack(
        [sum(0.5 * _expert_ref(x[t : t + 1], w, int(topk_ids[t, k]))[0] for k in range(2)) for t in range(4)]
    )
    torch.testing.assert_close(partials[0] + partials[1], expected, rtol=1e-4, atol=1e-4)


def test_log_layers_setting(
    vllm_env: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VLLM_EXL3_LOG_LAYERS", "1")
    block = _Block(_config())
    _load(block, _block_weights())
    with caplog.at_level("INFO", logger="sparkctl_exl3.vllm_plugin"):
        _finish(block.self_attn.qkv_proj)
    lines = [r.getMessage() for r in caplog.records]
    assert "exl3 l.self_attn.k_proj: K=3 codebook=mcg trellis=(16, 8, 48)" in lines
    assert "exl3 l.self_attn.v_proj: K=2.5 codebook=mul1 trellis=(16, 8, 40)" in lines
