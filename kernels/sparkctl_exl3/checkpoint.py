"""Tiny EXL3 checkpoints written locally, and their dequantized twins.

Real EXL3 models are gigabytes and live on a model hub that tests never reach, and the EXL3 converter
needs a GPU. But any bit pattern is a valid trellis (SPEC 2.2), so a random int16 trellis with random
sign-and-scale vectors *is* an EXL3 layer: its weight is whatever the decoder says it is. This module
writes such models in exactly the on-disk layout of SPEC 1 (tensor names, dtypes, shapes, codebook
markers, ``quantization_config``), small enough to serve through the real vLLM on a CPU, with K and the
codebook deliberately mixed across layers, shards and experts so that every loader path is exercised.

Each quantized model has a *twin*: the same model with every EXL3 linear replaced by the dense weight
the reference decoder reconstructs from it, stored as a plain fp32 ``nn.Linear`` weight and served
without quantization. Quantized and twin compute the same function, so their greedy outputs must agree;
that is the end-to-end proof that the plugin loads, shards and applies EXL3 layers correctly.

``write_model(spec, out_dir, ...)`` writes one model next to a tokenizer the caller supplies; ``DENSE`` (Llama)
and ``MOE`` (Mixtral-style routed experts) are the two shapes. The named generators that pair them with
sparkctl's tiny tokenizer live in ``sparkctl/models/tiny_exl3.py``: this package never imports sparkctl.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from . import reference

__all__ = [
    "DENSE",
    "MOE",
    "ModelSpec",
    "build_checkpoint",
    "dense_weight",
    "quantized_layers",
    "random_exl3_layer",
    "twin_tensors",
    "write_model",
]

#: Codebook standard deviations over all 65536 states (SPEC 2.3), used to scale suh/svh so that a layer's
#: dense weight has the spread the writer asks for.
_CODEBOOK_STD = {"3inst": 1.243711, "mcg": 1.2441, "mul1": 1.0003}

#: What the quantization_config says about the writer (SPEC 1.4: informational except quant_method).
_VERSION = "sparkctl-tiny-1"


@dataclass(frozen=True)
class ModelSpec:
    """Shape and quantization plan of one tiny model. All linear dims are multiples of 128 (SPEC 1.3)."""

    name: str
    architecture: str
    hidden: int
    heads: int
    kv_heads: int
    layers: int
    intermediate: int
    experts: int = 0
    top_k: int = 0
    seed: int = 0
    #: per linear: (K, codebook), cycled over every quantized linear in a fixed order
    plan: tuple[tuple[float, str], ...] = ()
    head_bits: int = 6
    head_codebook: str = "mul1"
    #: std of the dense lm_head weight times sqrt(hidden): large enough that greedy decoding has clear winners
    head_gain: float = 6.0
    attention_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# Dense: Llama with biases on q/k/v/o, 3 layers, every K from 2 to 6, all three codebooks, one half-integer
# rate (mul1 only, SPEC 2.5). q/k/v of one layer and gate/up get different K and codebooks on purpose: the
# plugin must keep a separate trellis, K and codebook per fused shard.
DENSE = ModelSpec(
    name="tiny-exl3-dense",
    architecture="llama",
    hidden=256,
    heads=4,
    kv_heads=2,
    layers=3,
    intermediate=512,
    seed=61,
    plan=(
        (4, "mul1"),
        (3, "mcg"),
        (5, "3inst"),
        (2.5, "mul1"),
        (4, "mcg"),
        (6, "mul1"),
        (3, "3inst"),
        (2, "mul1"),
        (5, "mcg"),
    ),
    attention_bias=True,
)

# MoE: Mixtral-style, 4 experts, top-2. Attention is quantized like the dense model; experts carry one
# codebook per layer (as exllamav3's fused MoE kernel requires) and K varying per expert and projection.
MOE = ModelSpec(
    name="tiny-exl3-moe",
    architecture="mixtral",
    hidden=256,
    heads=4,
    kv_heads=2,
    layers=2,
    intermediate=256,
    experts=4,
    top_k=2,
    seed=67,
    plan=((4, "mul1"), (3, "mcg"), (5, "3inst"), (2, "mul1"), (4, "mcg"), (6, "3inst"), (3, "mul1")),
)


# ------------------------------------------------------------------------------------------------
# One random EXL3 layer
# ------------------------------------------------------------------------------------------------


def _trellis_len(bits: float) -> int:
    whole = math.floor(bits)
    return 16 * whole if bits == whole else 16 * whole + 8


def random_exl3_layer(
    in_features: int,
    out_features: int,
    bits: float,
    codebook: str,
    generator: torch.Generator,
    *,
    gain: float = 1.0,
    bias: bool = False,
) -> dict[str, torch.Tensor]:
    """The stored tensors of one EXL3 linear (SPEC 1.1): trellis, suh, svh, the codebook marker, a bias.

    ``gain`` sets the spread of the dense weight: its entries have a standard deviation of about
    ``gain / sqrt(in_features)``, so activations neither vanish nor explode through a few layers. The
    scales vary per channel (0.75x..1.25x) like real per-channel RMS scales do, and carry random signs.
    """
    if in_features % 128 or out_features % 128:
        raise ValueError(f"EXL3 layers are padded to 128: got {in_features}x{out_features}")
    trellis = torch.randint(
        -(1 << 15),
        1 << 15,
        (in_features // 16, out_features // 16, _trellis_len(bits)),
        dtype=torch.int16,
        generator=generator,
    )
    scale = math.sqrt(gain / (_CODEBOOK_STD[codebook] * math.sqrt(in_features)))

    def signed_scales(n: int) -> torch.Tensor:
        signs = torch.randint(0, 2, (n,), generator=generator).float() * 2 - 1
        spread = 0.75 + 0.5 * torch.rand(n, generator=generator)
        return (signs * spread * scale).to(torch.float16)

    tensors = {"trellis": trellis, "suh": signed_scales(in_features), "svh": signed_scales(out_features)}
    if codebook in reference.MARKERS:
        tensors[codebook] = torch.tensor(reference.MARKERS[codebook], dtype=torch.int32)
    if bias:
        tensors["bias"] = (torch.randn(out_features, generator=generator) * 0.02).to(torch.float16)
    return tensors


def dense_weight(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """fp32 [O, I] (``nn.Linear.weight`` layout) of one EXL3 layer, reconstructed with the reference decoder.

    ``W = diag(suh) . Hk . W_hat . Hn . diag(svh)`` (SPEC 4) computed in fp32 from the reference's bit-exact
    ``w_hat`` and its Hadamard, and not rounded to fp16 like ``reference.weight``: the twin should compute the
    same function as the plugin's forward (which runs the rotations in fp32) as closely as fp32 allows.
    """
    codebook = reference.codebook_of(tensors)
    trellis, suh, svh = tensors["trellis"], tensors["suh"], tensors["svh"]
    reference.check_layer(trellis, suh, svh, codebook)
    w = reference.w_hat(trellis, codebook).double()
    h = reference.hadamard_128(dtype=torch.float64)
    i, o = w.shape
    w = (h @ w.reshape(i // 128, 128, o)).reshape(i, o)  # Hk . W_hat (block-diagonal from the left)
    w = (w.reshape(i, o // 128, 128) @ h).reshape(i, o)  # . Hn
    w = w * suh.double()[:, None] * svh.double()[None, :]
    return w.t().contiguous().float()


# ------------------------------------------------------------------------------------------------
# Whole models
# ------------------------------------------------------------------------------------------------


def quantized_layers(spec: ModelSpec) -> Iterator[tuple[str, int, int]]:
    """Every EXL3 linear of ``spec`` in writing order: (checkpoint prefix, in_features, out_features)."""
    q_out, kv_out = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    for i in range(spec.layers):
        p = f"model.layers.{i}"
        yield f"{p}.self_attn.q_proj", spec.hidden, q_out
        yield f"{p}.self_attn.k_proj", spec.hidden, kv_out
        yield f"{p}.self_attn.v_proj", spec.hidden, kv_out
        yield f"{p}.self_attn.o_proj", q_out, spec.hidden
        if spec.experts:
            for e in range(spec.experts):
                ep = f"{p}.block_sparse_moe.experts.{e}"
                yield f"{ep}.w1", spec.hidden, spec.intermediate
                yield f"{ep}.w3", spec.hidden, spec.intermediate
                yield f"{ep}.w2", spec.intermediate, spec.hidden
        else:
            yield f"{p}.mlp.gate_proj", spec.hidden, spec.intermediate
            yield f"{p}.mlp.up_proj", spec.hidden, spec.intermediate
            yield f"{p}.mlp.down_proj", spec.intermediate, spec.hidden
    yield "lm_head", spec.hidden, 0  # out_features = vocab, known once the tokenizer exists


def _moe_codebook(spec: ModelSpec, prefix: str) -> str | None:
    """Experts of one layer share a codebook (exllamav3's fused MoE kernel needs that; SPEC 5)."""
    if ".experts." not in prefix:
        return None
    layer = int(prefix.split(".")[2])
    return ("mcg", "mul1")[layer % 2]


def build_checkpoint(spec: ModelSpec, vocab: int) -> tuple[dict[str, torch.Tensor], dict]:
    """All tensors of the quantized checkpoint (safetensors names) and its ``tensor_storage`` map."""
    gen = torch.Generator().manual_seed(spec.seed)
    tensors: dict[str, torch.Tensor] = {}
    # Embeddings, norms and the router stay unquantized (SPEC 1.5), stored fp16 as the converter does.
    tensors["model.embed_tokens.weight"] = torch.randn(vocab, spec.hidden, generator=gen).to(torch.float16)
    storage: dict[str, dict] = {}
    step = 0
    for prefix, in_f, out_f in quantized_layers(spec):
        if prefix == "lm_head":
            bits, codebook, out_f, gain = spec.head_bits, spec.head_codebook, _pad128(vocab), spec.head_gain
        else:
            bits, codebook = spec.plan[step % len(spec.plan)]
            codebook = _moe_codebook(spec, prefix) or codebook
            step += 1
            gain = 1.0
        has_bias = spec.attention_bias and ".self_attn." in prefix
        layer = random_exl3_layer(in_f, out_f, bits, codebook, gen, gain=gain, bias=has_bias)
        for name, t in layer.items():
            tensors[f"{prefix}.{name}"] = t
        entry: dict = {
            "stored_tensors": {
                f"{prefix}.{n}": {
                    "shape": list(t.shape),
                    "n_bytes": t.numel() * t.element_size(),
                    "dtype": _st_dtype(t),
                }
                for n, t in layer.items()
            },
            "quant_format": "exl3",
            "bits_per_weight": bits,
        }
        if codebook in reference.MARKERS:
            entry[f"{codebook}_multiplier"] = reference.MARKERS[codebook] & 0xFFFFFFFF
        storage[prefix] = entry
    for i in range(spec.layers):
        p = f"model.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = _norm_weight(spec.hidden, gen)
        tensors[f"{p}.post_attention_layernorm.weight"] = _norm_weight(spec.hidden, gen)
        if spec.experts:
            # Router logits with a spread of ~2 so tokens really pick different experts.
            router = torch.randn(spec.experts, spec.hidden, generator=gen) * (2.0 / math.sqrt(spec.hidden))
            tensors[f"{p}.block_sparse_moe.gate.weight"] = router.to(torch.float16)
    tensors["model.norm.weight"] = _norm_weight(spec.hidden, gen)
    return tensors, storage


def twin_tensors(tensors: dict[str, torch.Tensor], vocab: int) -> dict[str, torch.Tensor]:
    """The unquantized twin: every EXL3 group becomes ``<p>.weight`` (fp32 [O, I]); the rest is widened to fp32.

    The lm_head's EXL3 padding rows (vocab padded to 128, SPEC 1.3) are cut off, as the plugin cuts them.
    """
    groups: dict[str, dict[str, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf in ("trellis", "suh", "svh", *reference.MARKERS):
            groups.setdefault(prefix, {})[leaf] = t
        else:
            out[name] = t.float()
    for prefix, group in groups.items():
        w = dense_weight(group)
        if prefix == "lm_head":
            w = w[:vocab]
        out[f"{prefix}.weight"] = w
    return out


def _pad128(n: int) -> int:
    return -(-n // 128) * 128


def _norm_weight(n: int, gen: torch.Generator) -> torch.Tensor:
    return (1.0 + 0.1 * torch.randn(n, generator=gen)).to(torch.float16)


def _st_dtype(t: torch.Tensor) -> str:
    return {torch.int16: "I16", torch.int32: "I32", torch.float16: "F16", torch.float32: "F32"}[t.dtype]


def _hf_config(spec: ModelSpec, vocab: int, token_ids: dict[str, int], dtype: str) -> dict:
    common = {
        "vocab_size": vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        # exllamav3 1.6.5 always writes a separate, quantized lm_head (SPEC 1.4)
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        **token_ids,
    }
    if spec.architecture == "llama":
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": spec.attention_bias,
            "mlp_bias": False,
            **common,
        }
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": spec.experts,
        "num_experts_per_tok": spec.top_k,
        "sliding_window": None,
        "router_aux_loss_coef": 0.0,
        "output_router_logits": False,
        **common,
    }


def _quantization_config(spec: ModelSpec, storage: dict) -> dict:
    """``quantization_config`` as exllamav3's compile.py writes it (SPEC 1.4); only quant_method is binding."""
    weights = {p: e["bits_per_weight"] for p, e in storage.items() if p != "lm_head"}
    counts: dict[str, int] = {}
    for e in storage.values():
        cb = next((c for c in reference.MARKERS if f"{c}_multiplier" in e), "3inst")
        counts[cb] = counts.get(cb, 0) + 1
    return {
        "quant_method": "exl3",
        "version": _VERSION,
        "bits": round(sum(weights.values()) / len(weights), 2),
        "head_bits": spec.head_bits,
        "calibration": {"rows": 0, "cols": 0},
        "out_scales": "never",
        "codebook": max(counts, key=lambda c: counts[c]),
    }


def write_model(
    spec: ModelSpec,
    out_dir: Path,
    *,
    vocab: int,
    token_ids: dict[str, int],
    eos_token_ids: list[int],
    twin: bool,
) -> None:
    """Write config.json, generation_config.json, model.safetensors (and quantization_config.json unless
    ``twin``) for ``spec`` into ``out_dir``, next to a tokenizer the caller has already written there.

    ``token_ids`` holds ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` of that tokenizer and
    ``eos_token_ids`` every id that ends a turn. The tokenizer is the caller's: this package is the shipped
    plugin and knows nothing of sparkctl's tiny-model tokenizer (``sparkctl.models.tiny_exl3`` pairs them).
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors, storage = build_checkpoint(spec, vocab)
    config = _hf_config(spec, vocab, token_ids, "float32" if twin else "float16")
    if twin:
        tensors = twin_tensors(tensors, vocab)
    else:
        qcfg = _quantization_config(spec, storage)
        config["quantization_config"] = qcfg
        _write_json(out_dir / "quantization_config.json", {**qcfg, "tensor_storage": storage})
    _write_json(out_dir / "config.json", config)
    _write_json(
        out_dir / "generation_config.json",
        {
            "bos_token_id": token_ids["bos_token_id"],
            "eos_token_id": list(eos_token_ids),
            "pad_token_id": token_ids["pad_token_id"],
        },
    )
    tmp = out_dir / ".model.safetensors.tmp"
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(tmp), metadata={"format": "pt"})
    os.chmod(tmp, 0o644)
    os.replace(tmp, out_dir / "model.safetensors")


def _write_json(path: Path, data: dict) -> None:
    """Sorted keys, trailing newline, written to a temp file and renamed: regenerated files are byte-identical."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; model files are meant to be shared
    os.replace(tmp, path)
