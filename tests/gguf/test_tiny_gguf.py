"""The tiny GGUF generators write files llama.cpp's own reader accepts, with our tokenizer and the layout
each architecture needs, byte-identical on every run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from sparkctl.models import tiny, tiny_gguf


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-gguf")
    tiny_gguf.make_tiny_gguf_llama(root / "llama")
    tiny_gguf.make_tiny_gguf_qwen3moe(root / "moe")
    tiny.make_tiny_llama(root / "hf")
    return {
        "llama": root / "llama" / tiny_gguf.LLAMA_FILE,
        "moe": root / "moe" / tiny_gguf.MOE_FILE,
        "hf": root / "hf",
    }


def _field(reader, key: str):
    f = reader.fields[key]
    if len(f.types) > 1 or f.types[0] == gguf.GGUFValueType.ARRAY:
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def _tensors(reader) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t.data) for t in reader.tensors}


def test_llama_is_the_tiny_checkpoint_converted(files) -> None:
    from safetensors.numpy import load_file

    r = gguf.GGUFReader(files["llama"])
    assert _field(r, "general.architecture") == "llama"
    assert _field(r, "llama.block_count") == tiny.LAYERS
    assert _field(r, "llama.embedding_length") == tiny.HIDDEN
    assert _field(r, "llama.attention.head_count") == tiny.HEADS
    hf = load_file(str(files["hf"] / "model.safetensors"))
    t = _tensors(r)
    assert len(t) == 2 + 9 * tiny.LAYERS + 1
    # same seeded weights as `tiny` (f16 now), in llama.cpp's names
    np.testing.assert_allclose(
        t["token_embd.weight"].astype(np.float32), hf["model.embed_tokens.weight"], atol=1e-3
    )
    np.testing.assert_allclose(
        t["blk.1.ffn_down.weight"], hf["model.layers.1.mlp.down_proj.weight"], atol=1e-3
    )
    # q rows reordered per head from [x.., y..] halves into interleaved (x, y) rotary pairs
    q_hf = hf["model.layers.0.self_attn.q_proj.weight"]
    q = t["blk.0.attn_q.weight"].astype(np.float32)
    half = tiny.HIDDEN // tiny.HEADS // 2
    np.testing.assert_allclose(q[0], q_hf[0], atol=1e-3)
    np.testing.assert_allclose(q[1], q_hf[half], atol=1e-3)
    np.testing.assert_allclose(q[2], q_hf[1], atol=1e-3)
    assert not np.allclose(q, q_hf, atol=1e-3)
    assert t["blk.0.attn_norm.weight"].dtype == np.float32 and q.shape == q_hf.shape


def test_moe_has_stacked_experts_and_qk_norms(files) -> None:
    r = gguf.GGUFReader(files["moe"])
    assert _field(r, "general.architecture") == "qwen3moe"
    assert _field(r, "qwen3moe.expert_count") == tiny_gguf.MOE_EXPERTS
    assert _field(r, "qwen3moe.expert_used_count") == tiny_gguf.MOE_EXPERTS_USED
    shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}  # ggml order: ne0 first
    for i in range(tiny_gguf.MOE_LAYERS):
        assert shapes[f"blk.{i}.ffn_gate_exps.weight"] == [
            tiny.HIDDEN,
            tiny_gguf.MOE_EXPERT_FF,
            tiny_gguf.MOE_EXPERTS,
        ]
        assert shapes[f"blk.{i}.ffn_down_exps.weight"] == [
            tiny_gguf.MOE_EXPERT_FF,
            tiny.HIDDEN,
            tiny_gguf.MOE_EXPERTS,
        ]
        assert shapes[f"blk.{i}.ffn_gate_inp.weight"] == [tiny.HIDDEN, tiny_gguf.MOE_EXPERTS]
        assert shapes[f"blk.{i}.attn_q_norm.weight"] == [tiny.HIDDEN // tiny.HEADS]


@pytest.mark.parametrize("which", ["llama", "moe"])
def test_tokenizer_is_the_tiny_one(files, which: str) -> None:
    r = gguf.GGUFReader(files[which])
    tok = json.loads((files["hf"] / "tokenizer.json").read_text())
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert _field(r, "tokenizer.ggml.model") == "gpt2"
    for text, i in tok["model"]["vocab"].items():
        assert tokens[i] == text
    ids = {t: tokens.index(t) for t in tiny.SPECIAL_TOKENS}
    assert _field(r, "tokenizer.ggml.bos_token_id") == ids[tiny.BOS]
    assert _field(r, "tokenizer.ggml.eot_token_id") == ids[tiny.TURN_END]
    types = _field(r, "tokenizer.ggml.token_type")
    assert (
        types[ids[tiny.EOS]] == gguf.TokenType.CONTROL and types[ids[tiny.BOS] + 10] == gguf.TokenType.NORMAL
    )
    assert len(_field(r, "tokenizer.ggml.merges")) == len(tok["model"]["merges"]) > 100
    assert _field(r, "tokenizer.chat_template") == tiny.CHAT_TEMPLATE


def test_byte_identical_on_every_run(files, tmp_path: Path) -> None:
    tiny_gguf.make_tiny_gguf_qwen3moe(tmp_path / "again")
    tiny_gguf.make_tiny_gguf_llama(tmp_path / "again")

    def digest(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    assert digest(tmp_path / "again" / tiny_gguf.MOE_FILE) == digest(files["moe"])
    assert digest(tmp_path / "again" / tiny_gguf.LLAMA_FILE) == digest(files["llama"])
