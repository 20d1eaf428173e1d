"""The tiny EXL3 checkpoint writer: SPEC 1 layout, mixed K and codebooks, twins equal to the decoder's W."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from sparkctl_exl3 import reference

from sparkctl.models import tiny_exl3


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)


def test_dense_layout_matches_spec(tiny_models: dict[str, Path]) -> None:
    t = _tensors(tiny_models["dense"])
    p = "model.layers.0.self_attn.q_proj"
    assert t[f"{p}.trellis"].dtype == torch.int16 and t[f"{p}.trellis"].shape == (16, 16, 64)  # K=4
    assert t[f"{p}.suh"].dtype == torch.float16 and t[f"{p}.suh"].shape == (256,)
    assert t[f"{p}.svh"].shape == (256,) and t[f"{p}.bias"].dtype == torch.float16
    assert t[f"{p}.mul1"].dtype == torch.int32 and t[f"{p}.mul1"].dim() == 0
    assert int(t[f"{p}.mul1"]) == reference.MARKERS["mul1"]
    # nothing but EXL3 groups, norms and embeddings; no .weight for a quantized module
    assert "model.layers.0.self_attn.q_proj.weight" not in t
    assert t["model.embed_tokens.weight"].dtype == torch.float16
    assert t["lm_head.trellis"].shape == (256 // 16, 640 // 16, 96)  # head_bits 6, vocab 640


def test_mixed_bits_and_codebooks(tiny_models: dict[str, Path]) -> None:
    t = _tensors(tiny_models["dense"])
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, v in t.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf in ("trellis", "mcg", "mul1"):
            groups.setdefault(prefix, {})[leaf] = v
    bits = {reference.bits_of(g["trellis"]) for g in groups.values()}
    books = {reference.codebook_of(g) for g in groups.values()}
    assert {2.0, 2.5, 3.0, 4.0, 5.0, 6.0} <= bits
    assert books == {"3inst", "mcg", "mul1"}
    # the shards vLLM fuses differ in K and codebook, so the plugin must keep them apart
    qkv = [groups[f"model.layers.0.self_attn.{n}_proj"] for n in "qkv"]
    assert len({(reference.bits_of(g["trellis"]), reference.codebook_of(g)) for g in qkv}) == 3


def test_moe_experts_per_expert(tiny_models: dict[str, Path]) -> None:
    t = _tensors(tiny_models["moe"])
    for e in range(4):
        for proj, shape in (("w1", (16, 16)), ("w3", (16, 16)), ("w2", (16, 16))):
            tr = t[f"model.layers.1.block_sparse_moe.experts.{e}.{proj}.trellis"]
            assert tr.shape[:2] == shape
            assert f"model.layers.1.block_sparse_moe.experts.{e}.{proj}.mul1" in t  # one codebook per layer
    assert t["model.layers.0.block_sparse_moe.gate.weight"].shape == (4, 256)  # router stays unquantized
    kinds = {
        reference.bits_of(t[f"model.layers.0.block_sparse_moe.experts.{e}.w1.trellis"]) for e in range(4)
    }
    assert len(kinds) > 1


def test_quantization_config(tiny_models: dict[str, Path]) -> None:
    cfg = json.loads((tiny_models["dense"] / "config.json").read_text())
    q = cfg["quantization_config"]
    assert q["quant_method"] == "exl3" and q["head_bits"] == 6 and q["codebook"] in reference.CODEBOOKS
    assert cfg["tie_word_embeddings"] is False
    full = json.loads((tiny_models["dense"] / "quantization_config.json").read_text())
    entry = full["tensor_storage"]["model.layers.0.self_attn.k_proj"]
    assert entry["quant_format"] == "exl3" and entry["bits_per_weight"] == 3
    assert entry["mcg_multiplier"] == 0xCBAC1FED
    twin = json.loads((tiny_models["dense-twin"] / "config.json").read_text())
    assert "quantization_config" not in twin and twin["torch_dtype"] == "float32"


def test_twin_weights_are_the_decoded_weights(tiny_models: dict[str, Path]) -> None:
    q, twin = _tensors(tiny_models["dense"]), _tensors(tiny_models["dense-twin"])
    for p in ("model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.q_proj", "lm_head"):
        group = {k.rsplit(".", 1)[1]: v for k, v in q.items() if k.rsplit(".", 1)[0] == p}
        w16 = reference.weight(group["trellis"], group["suh"], group["svh"], reference.codebook_of(group))
        w = twin[f"{p}.weight"]
        assert w.dtype == torch.float32 and w.shape[1] == w16.shape[0]  # [O, I], lm_head cut to the vocab
        torch.testing.assert_close(w, w16.t().float()[: w.shape[0]], rtol=1e-3, atol=1e-5)
    assert twin["model.layers.0.self_attn.q_proj.bias"].dtype == torch.float32
    torch.testing.assert_close(
        twin["model.embed_tokens.weight"], q["model.embed_tokens.weight"].float(), rtol=0, atol=0
    )


def test_activations_stay_sane(tiny_models: dict[str, Path]) -> None:
    """The chosen scales keep a layer's output on the scale of its input (no blow-up through the stack)."""
    t = _tensors(tiny_models["dense"])
    group = {k.rsplit(".", 1)[1]: v for k, v in t.items() if k.startswith("model.layers.2.mlp.down_proj.")}
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(0))
    y = reference.matmul(x, group["trellis"], group["suh"], group["svh"], reference.codebook_of(group))
    assert 0.5 < float(y.std()) < 2.0


def test_writer_is_deterministic(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    tiny_exl3.make_tiny_moe(tmp_path / "again")
    for name in ("model.safetensors", "config.json", "quantization_config.json"):
        a = hashlib.sha256((tmp_path / "again" / name).read_bytes()).hexdigest()
        b = hashlib.sha256((tiny_models["moe"] / name).read_bytes()).hexdigest()
        assert a == b, name
