"""The tiny-llama generator writes a loadable, deterministic Llama with a working chat template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sparkctl.models.tiny import EOS, TURN_END, make_tiny_llama, write_tokenizer


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_deterministic_and_shapes_match_config(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_tiny_llama(a)
    make_tiny_llama(b)
    assert _digests(a) == _digests(b)

    from safetensors.numpy import load_file

    cfg = json.loads((a / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == cfg["head_dim"] == 64  # vLLM CPU needs 64
    w = load_file(str(a / "model.safetensors"))
    v, h = cfg["vocab_size"], cfg["hidden_size"]
    assert w["model.embed_tokens.weight"].shape == (v, h)
    assert w["lm_head.weight"].shape == (v, h)
    assert w["model.layers.0.self_attn.k_proj.weight"].shape == (cfg["num_key_value_heads"] * 64, h)
    assert w["model.layers.1.mlp.down_proj.weight"].shape == (h, cfg["intermediate_size"])
    n_layers = {k.split(".")[2] for k in w if k.startswith("model.layers.")}
    assert len(n_layers) == cfg["num_hidden_layers"]
    assert all(t.dtype.name == "float32" for t in w.values())
    assert (a / "model.safetensors").stat().st_size < 2_000_000


@pytest.mark.slow
def test_tokenizer_loads_in_transformers_with_chat_template(tmp_path):
    transformers = pytest.importorskip("transformers")
    make_tiny_llama(tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert len(tok) == cfg["vocab_size"]
    assert tok.eos_token_id == cfg["eos_token_id"]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hello! café 😀"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("assistant\n")
    assert f"Hello! café 😀{TURN_END}" in text
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text  # byte-level: lossless, no unknown token
    # Training found real merges: common words are single tokens, not a byte each.
    assert len(tok("the model")["input_ids"]) < len("the model")
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids(TURN_END) in gen["eos_token_id"]
    assert tok.convert_tokens_to_ids(EOS) in gen["eos_token_id"]


def test_write_tokenizer_alone(tmp_path):
    write_tokenizer(tmp_path / "t")
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
