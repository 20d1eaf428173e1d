"""The `tiny-gguf` and `tiny-gguf-moe` generators: GGUF files written locally with PyPI's `gguf` package.

They exist so that the llama.cpp path (`sparkctl up tiny-gguf`, the end-to-end tests) runs the real
`llama-server` on a machine with no GPU and no model hub. Both speak the tokenizer every tiny model
shares (sparkctl/models/tiny.py), embedded as a GPT-2 style byte-level BPE with its chat template.

- `tiny-gguf` is the `tiny-llama` checkpoint itself, converted: the same seeded weights vLLM serves in
  `tiny`, with q/k rows permuted into the interleaved rotary layout llama.cpp's `llama` graph expects.
- `tiny-gguf-moe` is a random Qwen3-MoE (`qwen3moe`): 8 experts, 2 routed per token, per-head q/k norms,
  stacked `*_exps` expert tensors; small, but laid out like the 30B-A3B so `--n-cpu-moe` and
  `--override-tensor` patterns have real expert tensors to act on.

Weights are f16 (norms f32), as llama.cpp's converter writes them by default; everything is seeded, so
two runs write byte-identical files.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from sparkctl.models import tiny

LLAMA_FILE = "tiny-llama-F16.gguf"
MOE_FILE = "tiny-qwen3moe-F16.gguf"

# tiny-gguf-moe's shape: hidden 128 = 2 heads x head_dim 64 (the same attention as tiny), 8 experts of
# width 64 with 2 routed per token, 2 layers.
MOE_LAYERS = 2
MOE_EXPERTS = 8
MOE_EXPERTS_USED = 2
MOE_EXPERT_FF = 64
MOE_SEED = 20261


def make_tiny_gguf_llama(out_dir: Path) -> None:
    """Convert the `tiny-llama` checkpoint (made in a temp dir) to one GGUF file in `out_dir`."""
    from safetensors.numpy import load_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiny-llama-") as tmp:
        src = Path(tmp)
        tiny.make_tiny_llama(src)
        config = json.loads((src / "config.json").read_text())
        weights = load_file(str(src / "model.safetensors"))
        vocab = _vocab(src)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["head_dim"]

    writer = _writer(out_dir / LLAMA_FILE, "llama", "tiny-llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    _add_tokenizer(writer, vocab)

    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    _add(writer, "token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(config["num_hidden_layers"]):
        for hf, gg in names.items():
            w = weights[f"model.layers.{i}.{hf}.weight"]
            if hf == "self_attn.q_proj":
                w = _rope_interleave(w, heads)
            elif hf == "self_attn.k_proj":
                w = _rope_interleave(w, kv_heads)
            _add(writer, f"blk.{i}.{gg}.weight", w)
    _add(writer, "output_norm.weight", weights["model.norm.weight"])
    _add(writer, "output.weight", weights["lm_head.weight"])
    _finish(writer)


def make_tiny_gguf_qwen3moe(out_dir: Path) -> None:
    """Write a random-weight Qwen3-MoE GGUF (tiny tokenizer) into `out_dir`."""
    import numpy as np

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiny-tokenizer-") as tmp:
        tiny.write_tokenizer(Path(tmp))
        vocab = _vocab(Path(tmp))
    n_vocab = len(vocab["tokens"])
    hidden, heads, kv_heads = tiny.HIDDEN, tiny.HEADS, tiny.KV_HEADS
    head_dim = hidden // heads

    writer = _writer(out_dir / MOE_FILE, "qwen3moe", "tiny-qwen3moe")
    writer.add_context_length(tiny.MAX_POSITIONS)
    writer.add_embedding_length(hidden)
    writer.add_block_count(MOE_LAYERS)
    writer.add_feed_forward_length(MOE_EXPERT_FF * MOE_EXPERTS_USED)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(MOE_EXPERTS)
    writer.add_expert_used_count(MOE_EXPERTS_USED)
    writer.add_expert_feed_forward_length(MOE_EXPERT_FF)
    writer.add_vocab_size(n_vocab)
    _add_tokenizer(writer, vocab)

    rng = np.random.default_rng(MOE_SEED)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * tiny.INIT_STD).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    # numpy shapes are ggml's ne reversed: an expert bank [n_expert, rows, cols] is ne {cols, rows, n_expert}
    _add(writer, "token_embd.weight", normal(n_vocab, hidden))
    for i in range(MOE_LAYERS):
        p = f"blk.{i}"
        _add(writer, f"{p}.attn_norm.weight", ones(hidden))
        _add(writer, f"{p}.attn_q.weight", normal(heads * head_dim, hidden))
        _add(writer, f"{p}.attn_k.weight", normal(kv_heads * head_dim, hidden))
        _add(writer, f"{p}.attn_v.weight", normal(kv_heads * head_dim, hidden))
        _add(writer, f"{p}.attn_output.weight", normal(hidden, heads * head_dim))
        _add(writer, f"{p}.attn_q_norm.weight", ones(head_dim))
        _add(writer, f"{p}.attn_k_norm.weight", ones(head_dim))
        _add(writer, f"{p}.ffn_norm.weight", ones(hidden))
        _add(writer, f"{p}.ffn_gate_inp.weight", normal(MOE_EXPERTS, hidden))
        _add(writer, f"{p}.ffn_gate_exps.weight", normal(MOE_EXPERTS, MOE_EXPERT_FF, hidden))
        _add(writer, f"{p}.ffn_up_exps.weight", normal(MOE_EXPERTS, MOE_EXPERT_FF, hidden))
        _add(writer, f"{p}.ffn_down_exps.weight", normal(MOE_EXPERTS, hidden, MOE_EXPERT_FF))
    _add(writer, "output_norm.weight", ones(hidden))
    _add(writer, "output.weight", normal(n_vocab, hidden))
    _finish(writer)


# ------------------------------------------------------------------------------------------ helpers


def _vocab(tokenizer_dir: Path) -> dict[str, Any]:
    """Tokens in id order, their GGUF types, BPE merges and special ids, from the tiny tokenizer.json."""
    import gguf

    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {i: t for t, i in data["model"]["vocab"].items()}
    specials = {a["id"]: a["content"] for a in data.get("added_tokens", [])}
    by_id.update(specials)
    n = max(by_id) + 1
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    types = [
        gguf.TokenType.CONTROL
        if i in specials
        else gguf.TokenType.NORMAL
        if i in by_id
        else gguf.TokenType.UNUSED
        for i in range(n)
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    ids = {t: i for i, t in specials.items()}
    return {
        "tokens": tokens,
        "types": types,
        "merges": merges,
        "bos": ids[tiny.BOS],
        "eos": ids[tiny.EOS],
        "pad": ids[tiny.PAD],
        "eot": ids[tiny.TURN_END],
    }


def _writer(path: Path, arch: str, name: str) -> Any:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    return writer


def _add_tokenizer(writer: Any, vocab: dict[str, Any]) -> None:
    # model "gpt2" + pre "gpt-2": byte-level BPE split by GPT-2's regex, which is what the `tokenizers`
    # ByteLevel pre-tokenizer the tiny tokenizer was trained with does.
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    writer.add_pad_token_id(vocab["pad"])
    writer.add_eot_token_id(vocab["eot"])  # ends the assistant's turn, as in the chat template
    writer.add_add_bos_token(False)  # the chat template writes it
    writer.add_add_eos_token(False)
    writer.add_chat_template(tiny.CHAT_TEMPLATE)


def _add(writer: Any, name: str, tensor: Any) -> None:
    """Norms (1-D) stay f32, matrices go f16: what llama.cpp's converter does for an f16 file."""
    import numpy as np

    writer.add_tensor(name, tensor.astype(np.float32 if tensor.ndim == 1 else np.float16))


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _rope_interleave(w: Any, n_heads: int) -> Any:
    """HF Llama keeps each head's rotary halves apart ([x0..x31, y0..y31]); llama.cpp's `llama` graph
    rotates adjacent pairs ([x0, y0, x1, y1, ...]). Reorder the rows of q/k so both compute the same."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
