"""A tiny Qwen4Exp-shaped EXL3 pack, laid out as turboderp's Qwen3.8-Flash-Next pack is (our own writer).

What the real pack (``turboderp/Qwen3.8-Flash-Next-exl3``, revision ``3.05bpw_h5_ng5``) does that matters for
loading, reproduced at toy size so the prepare stage and the plugin's Qwen4Exp pieces are tested on it:

- ``ngram_embedding.safetensors``: one per-layer n-gram (PLE) table in exllamav3's ``exl3_ngram_trellis`` codec
  (``sparkctl_exl3.ngram``; rows of 160 at K=5 by default), under the model-scoped key
  ``model.language_model.layers.<i>.ple.ple_embedding.ngram_embedding``, its rows cut in ``shard_<n>`` tensors;
  the heads' row layout and hash multipliers are the model's own (computed here by the rule Qwen4Exp's config
  defines: :func:`ngram_layout`), as exllamav3's converter copies them from the source model;
- ``model.safetensors``: an EXL3 (mul1) ``lm_head``, the plain token embedding, and a vision block that stores
  both its split q/k/v and the fused bf16 ``attn.qkv`` copy;
- ``model.safetensors.index.json`` as shipped: it lists ``model.safetensors`` only, omitting the n-gram file;
- ``config.json``: ``Qwen4ExpForConditionalGeneration`` whose ``quantization_config`` is missing (the prepare
  stage writes the EXL3 declaration into its overlay).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from . import checkpoint, ngram

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_LAYER_PRIME = 10007  # per-layer seed stride of the hash multipliers


@dataclass(frozen=True)
class TinyQwen4Exp:
    vocab: int = 512
    hidden: int = 256
    ngram_size: int = 3
    heads_per_ngram: int = 2
    row_dim: int = ngram.ROW_DIM
    ngram_vocab_size_base: int = 200
    divisor: int = 128  # make_ngram_vocab_size_divisible_by
    ple_layer: int = 1  # 0-based index of the one decoder layer with a PLE table
    bits: int = 5
    shard_rows: int = 448
    seed: int = 1234
    eos_token_id: int = 2

    @property
    def heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def table_prefix(self) -> str:
        return f"model.language_model.layers.{self.ple_layer}.ple.ple_embedding.ngram_embedding"


def _splitmix64(value: int) -> int:
    value = (value + _GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def ngram_layout(spec: TinyQwen4Exp, dense_layer: int = 0) -> tuple[list[int], list[int], list[int], int]:
    """(head sizes, head offsets, hash multipliers, padded rows) of one PLE layer, by the model's rule: head h of
    layer d holds the (d*heads + h + 1)-th prime above ``ngram_vocab_size_base - 1`` rows, heads back to back,
    the total padded to ``divisor``; multiplier i is odd, from splitmix64 of the layer's seed (small primes only:
    a tiny table's head sizes are trial-divided)."""
    sizes: list[int] = []
    candidate = spec.ngram_vocab_size_base - 1
    for _ in range(dense_layer * spec.heads + spec.heads):
        candidate += 1
        while not _is_prime(candidate):
            candidate += 1
        sizes.append(candidate)
    sizes = sizes[dense_layer * spec.heads :]
    offsets = [sum(sizes[:h]) for h in range(spec.heads)]
    rows = -(-sum(sizes) // spec.divisor) * spec.divisor
    half = max(1, ((1 << 63) - 1) // spec.vocab // 2)
    base = spec.seed + _LAYER_PRIME * dense_layer
    multipliers = [2 * (_splitmix64(base + _GAMMA * (i + 1)) % half) + 1 for i in range(spec.ngram_size)]
    return sizes, offsets, multipliers, rows


def ngram_table(spec: TinyQwen4Exp, *, seed: int = 0) -> ngram.NgramTable:
    """The packed table: random rings (any stream decodes), realistic scales and per-head biases."""
    sizes, offsets, multipliers, rows = ngram_layout(spec)
    g = torch.Generator().manual_seed(seed)
    words = ngram.words_per_row(spec.bits, spec.row_dim)
    stream = torch.randint(-(1 << 15), 1 << 15, (rows, words - 1), generator=g, dtype=torch.int32)
    scales = (torch.rand(rows, generator=g) * 0.02 + 0.005).to(torch.float16)
    packed = torch.cat((scales.view(torch.int16).view(rows, 1), stream.to(torch.int16)), dim=1)
    return ngram.NgramTable(
        shards=list(torch.split(packed, spec.shard_rows)),
        head_bias=(torch.randn(spec.heads, spec.row_dim, generator=g) * 0.01).to(torch.float16),
        head_offsets=torch.tensor(offsets, dtype=torch.int64),
        head_vocab_sizes=torch.tensor(sizes, dtype=torch.int64),
        layer_multipliers=torch.tensor(multipliers, dtype=torch.int64),
    )


def config(spec: TinyQwen4Exp) -> dict:
    """config.json as the published pack ships it (no quantization_config: the prepare stage adds it)."""
    text = {
        "model_type": "qwen4_exp_text",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.ple_layer + 1,
        "ple_layer_ids": [spec.ple_layer + 1],
        "ngram_size": spec.ngram_size,
        "heads_per_ngram": spec.heads_per_ngram,
        "ple_embed_dim": spec.heads * spec.row_dim,
        "ngram_vocab_size_base": spec.ngram_vocab_size_base,
        "make_ngram_vocab_size_divisible_by": spec.divisor,
        "split_ngram_parts": -(-ngram_layout(spec)[3] // spec.shard_rows),
        "seed": spec.seed,
        "eos_token_id": spec.eos_token_id,
        "tie_word_embeddings": False,
    }
    return {
        "architectures": ["Qwen4ExpForConditionalGeneration"],
        "model_type": "qwen4_exp",
        "text_config": text,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def write_pack(out_dir: Path, spec: TinyQwen4Exp = TinyQwen4Exp(), *, seed: int = 0) -> ngram.NgramTable:
    """Write the pack into ``out_dir``; returns its n-gram table (the expected values of every lookup)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed + 1)
    table = ngram_table(spec, seed=seed)
    ngram.save_table(
        out_dir / "ngram_embedding.safetensors", spec.table_prefix, table, source="sparkctl tiny"
    )
    head = checkpoint.random_exl3_layer(spec.hidden, spec.vocab, 4, "mul1", g)
    vis = "model.visual.blocks.0.attn"
    tensors = {f"lm_head.{k}": v for k, v in head.items()}
    tensors["model.language_model.embed_tokens.weight"] = torch.randn(
        spec.vocab, spec.hidden, generator=g
    ).to(torch.bfloat16)
    tensors[f"{vis}.qkv.weight"] = torch.randn(3 * 128, 128, generator=g).to(torch.bfloat16)
    for part in ("q", "k", "v"):
        for k, v in checkpoint.random_exl3_layer(128, 128, 4, "mul1", g).items():
            tensors[f"{vis}.{part}.{k}"] = v
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(out_dir / "model.safetensors"))
    index = {"metadata": {}, "weight_map": dict.fromkeys(sorted(tensors), "model.safetensors")}
    for name, data in (("config.json", config(spec)), ("model.safetensors.index.json", index)):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, out_dir / name)
    return table
