"""Tiny packs shaped like published ones, and the Hugging Face cache layout they are downloaded into.

`write_qwen4exp_pack` makes a Qwen4Exp-shaped EXL3 pack as turboderp's Qwen3.8-Flash-Next-exl3 is laid
out: model shards with EXL3 linears (mul1) and an EXL3 lm_head, an n-gram (PLE) table in
`ngram_embedding.safetensors` written by our own writer in exllamav3's `exl3_ngram_trellis` format, an
MTP patch file, and a shipped `model.safetensors.index.json` that, like the published one, names only
the model shards. `hf_cache` then stores any directory the way huggingface_hub does (blobs named by
content hash, a snapshot of relative links per commit, a ref per revision).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from sparkctl_exl3 import ngram
from sparkctl_exl3.checkpoint import random_exl3_layer

NGRAM_PREFIX = "model.language_model.layers.1.ple.ple_embedding.ngram_embedding"
NGRAM_HEADS = 8  # (ngram_size 3 - 1) x heads_per_ngram 4
NGRAM_ROWS_PER_HEAD = 96
NGRAM_BITS = 5
NGRAM_SHARD_ROWS = 256
HIDDEN = 128
VOCAB = 256


def _layer(prefix: str, i: int, o: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{k}": v for k, v in random_exl3_layer(i, o, 4, "mul1", g).items()}


def write_qwen4exp_pack(out: Path, *, seed: int = 0) -> ngram.NgramTable:
    """Write the pack into `out`; returns the n-gram table it holds (for comparing lookups)."""
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    lm = "model.language_model"
    shard1 = {
        f"{lm}.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=g).to(torch.bfloat16),
        **_layer(f"{lm}.layers.0.linear_attn.in_proj_qkv", HIDDEN, 3 * HIDDEN, g),
        **_layer(f"{lm}.layers.0.linear_attn.out_proj", HIDDEN, HIDDEN, g),
    }
    shard2 = {
        **_layer(f"{lm}.layers.1.self_attn.q_proj", HIDDEN, HIDDEN, g),
        **_layer(f"{lm}.layers.1.mlp.experts.0.gate_proj", HIDDEN, HIDDEN, g),
        f"{lm}.layers.1.mlp.gate.weight": torch.randn(4, HIDDEN, generator=g).to(torch.bfloat16),
        **_layer("lm_head", HIDDEN, VOCAB, g),
    }
    save_file(shard1, str(out / "model-00001-of-00002.safetensors"))
    save_file(shard2, str(out / "model-00002-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {}}
    for name, tensors in (
        ("model-00001-of-00002.safetensors", shard1),
        ("model-00002-of-00002.safetensors", shard2),
    ):
        index["weight_map"].update(dict.fromkeys(tensors, name))
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

    table = ngram.random_table(
        NGRAM_HEADS, NGRAM_ROWS_PER_HEAD, NGRAM_BITS, shard_rows=NGRAM_SHARD_ROWS, seed=seed + 1
    )
    ngram.save_table(out / "ngram_embedding.safetensors", NGRAM_PREFIX, table)
    save_file(
        {
            "mtp.layers.0.hyper_connection_mixer.weight": torch.randn(4, HIDDEN, generator=g).to(
                torch.bfloat16
            )
        },
        str(out / "mtp_hyper_connection_mixer_patch.safetensors"),
    )
    config = {
        "architectures": ["Qwen4ExpForConditionalGeneration"],
        "model_type": "qwen4_exp",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen4_exp_text",
            "hidden_size": HIDDEN,
            "vocab_size": VOCAB,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "ple_layer_ids": [2],
            "ple_embed_dim": NGRAM_HEADS * ngram.ROW_DIM,
            "ngram_size": 3,
            "heads_per_ngram": 4,
            "mtp_num_hidden_layers": 1,
        },
        "quantization_config": {
            "quant_method": "exl3",
            "version": "1.6.5",
            "bits": 4.0,
            "head_bits": 4,
            "calibration": {"rows": 250, "cols": 2048},
            "out_scales": "auto",
            "codebook": "mul1",
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=4))
    (out / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 262144}))
    return table


def hf_cache(src: Path, cache: Path, repo: str, revision: str) -> Path:
    """Store `src` in a Hugging Face hub cache at `cache` (HF_HUB_CACHE) under `repo`@`revision`.

    Returns the snapshot directory. The layout is huggingface_hub's: `models--owner--name/blobs/<sha256>`,
    `snapshots/<commit>/<file>` as relative links into blobs, `refs/<revision>` holding the commit.
    """
    folder = cache / ("models--" + repo.replace("/", "--"))
    files = sorted(p for p in src.rglob("*") if p.is_file())
    commit = hashlib.sha1(b"".join(p.relative_to(src).as_posix().encode() for p in files)).hexdigest()
    snap = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    for p in files:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        blob = folder / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(p, blob)
        link = snap / p.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / revision).write_text(commit)
    return snap


def tree_state(root: Path) -> dict[str, tuple]:
    """Everything about a directory tree a write would change: entries, modes, times, link targets, bytes."""
    state: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                state[rel] = ("link", os.readlink(p), st.st_mtime_ns)
            elif p.is_dir():
                state[rel] = ("dir", st.st_mode, st.st_mtime_ns)
            else:
                state[rel] = (
                    "file",
                    st.st_mode,
                    st.st_size,
                    st.st_mtime_ns,
                    hashlib.sha256(p.read_bytes()).hexdigest(),
                )
    st = root.lstat()
    state["."] = ("root", st.st_mode, st.st_mtime_ns)
    return state


@dataclass
class PackCache:
    hub: Path  # HF_HUB_CACHE
    snapshot: Path
    table: object  # the NgramTable written into the pack
    recipe: Path
    env: dict[str, str]

    def sparkctl(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Run the real CLI as a user would, offline, against this cache (`env` adds variables)."""
        return subprocess.run(
            [sys.executable, "-m", "sparkctl", *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
