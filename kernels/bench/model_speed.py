"""Model-level decode and prefill speed, side by side on one GPU and one checkpoint: vLLM + the exl3 plugin against
exllamav3's own generator (issue 34, step 3).

Converting a real GLM-class model does not fit a device call, but any int16 bit pattern is a valid EXL3 trellis for
any K (SPEC 2.2), so the checkpoint is written on the device, at real dimensions, with random bits:

* ``Glm4MoeForCausalLM`` (both exllamav3 1.6.5 and vLLM 0.26 load it): hidden 4096, GQA attention (GLM-4.5-Air's:
  96 query heads, 8 KV heads of 128, partial rotary 0.5, q/k/v bias), every layer MoE (``first_k_dense_replace``
  0): 128 routed experts of width 1536, top-8, sigmoid routing with a correction bias, one shared expert; 4 and 8
  layers by default (the 4-layer directory hard-links the 8-layer one's files);
* every linear EXL3 at K=2 with the mul1 codebook: trellis random int16, ``suh`` random signs, ``svh`` random signs
  / sqrt(in_features) (activations keep unit scale, nothing overflows fp16), ``mul1`` the marker constant;
  ``lm_head`` EXL3 at 6 bits over 151552 tokens; embeddings and norms bf16, the router fp16 (SPEC 1.5);
* a word-level tokenizer with one piece per id (the engines decode whatever the random model emits).

Each safetensors file is written from one device buffer (tensors ordered by element size, so each is aligned to its
own size): 6.8 GB for 8 layers. Then each engine in its own process, one after the other (GPU memory is freed
between them), at each depth, shallowest first:

* **TTFT** for a 2048- and an 8192-token prompt: wall time of a request for one token, fresh prompt ids each time
  (no prefix-cache hit in either engine); both prefill in chunks of 2048 (exllamav3's ``max_chunk_size`` default;
  vLLM's ``max_num_batched_tokens`` set to match).
* **Decode** at batch 1 and 8 after a 2048-token prompt: wall times of the same request(s) with 32 and 160 new
  tokens (greedy, no stop condition / ``ignore_eos``), fresh prompts each time; one step = (T(160) - T(32)) / 128,
  so prefill, queueing, start-up and a batch's ramp (its prefills interleaved with the first decode steps) cancel.
  Medians of 3 pairs, after one untimed run of every shape. exllamav3's generator runs with ``prefill_cooldown=0``
  (a waiting prompt's chunk in every iteration, as vLLM's scheduler does), so a batch of 8 fills in ~16 steps in
  either engine, inside the first 32 tokens.
* **lm_head alone** at 1 and 8 rows through the engine's own kernel for it (exllamav3's ``Linear``; our
  ``exl3_gemm`` op, as the plugin's head calls it): CUDA events around 50 calls.

exllamav3: ``Config.from_directory -> Model.from_config -> Cache -> model.load("cuda:0") -> Generator`` with
``ArgmaxSampler``, its prebuilt extension from ``.device/peer`` (``peer_unpack.sh``; never JIT-built here). vLLM:
``vllm.LLM`` with the plugin, fp16, Triton attention, default compilation (torch.compile + CUDA graphs), prefix
caching off; which of our kernel paths its worker reached (``sparkctl_exl3.paths``) comes back through
``collective_rpc``, and a fallback (reference decoder, per-expert MoE) is flagged in the report.

The report (:func:`assemble`, :func:`render`): per-layer decode time as the slope of the step time between the two
depths (what one more layer costs; embeddings, lm_head, sampling and host overhead cancel), and per depth as
(step - lm_head alone) / layers (the only figure one depth gives: an upper bound that spreads the host overhead over
the layers); the bandwidth floor of one layer (the weight bytes one decode step reads: attention, router, shared
expert and the expected distinct routed experts under uniform routing, over the H100's 3.35 TB/s; KV reads at 2k
shown apart); the GB10 projection (per-layer time times 3350 / 273, the bandwidth ratio: decode is taken to stay as
bandwidth-bound on the GB10 as measured here; the SM ratio 132 / 48 is smaller, so bandwidth governs); GLM-5.3-Flash
single-stream decode on one Spark (40 layers + this lm_head at GB10 bandwidth, host overhead as measured here)
without and with MTP k=2 (``projection``) at ``--mtp-acceptance``, else the MTP job of the newest engine check
record, else "not measured"; and the issue's verdict (vLLM per-layer batch-1 decode <= exllamav3's, TTFT at 2k no
worse).

Device command: kernels/README.md, "Model speed". ``--dry-run`` (CPU, here and in tests/kernels/test_model_speed.py):
a tiny checkpoint through the same writer, checked against safetensors' reader, the plugin's name rules, exllamav3's
loader (its Python side with a stand-in extension, as make_fixtures.py's dry run) and vLLM's model config, then the
vLLM half of the driver on vLLM's CPU build at tiny sizes, and the report.

    python3 kernels/bench/model_speed.py --out DIR [--work /tmp/model_speed] [--layers 4,8] [--quick]
        [--engines exllamav3,vllm] [--write-only] [--mtp-acceptance A] [--budget-s 400] [--dry-run]

Writes ``DIR/model_speed.json``, ``DIR/model_speed.txt`` and ``DIR/<engine>-L<layers>.log``. Exit 0: every run
measured; 1: a run failed or was skipped for time (the report still comes out); 2: bad arguments or no CUDA.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import random
import re
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = Path(__file__).resolve().parent
RECORDS = BENCH / "records"

MUL1_MARKER = -2082680531  # 0x83DCD12D as int32 (SPEC 1.1)
H100_GBS = 3350.0  # H100 SXM HBM3
#: peak memory bandwidth (GB/s) of the GPUs a device call may land on, by a word of torch's device name; the floors
#: and the GB10 projection use the measuring GPU's own figure (a call may get an H200 for an H100)
GPU_GBS = {"H200": 4800.0, "H100": H100_GBS}
GB10_GBS = 273.0
H100_SMS, GB10_SMS = 132, 48
GLM53_FLASH_LAYERS = 40  # GLM-5.3-Flash's MoE layers
MTP_K = 2
CHUNK = 2048  # prefill chunk of both engines (exllamav3's Generator default)
FIRST_SPECIAL = 4  # ids 0..3: <unk> <bos> <eos> <pad>; prompts draw from the rest

_DTYPES = {"I16": 2, "F16": 2, "BF16": 2, "I32": 4, "F32": 4}


# -- the checkpoint ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """Dimensions of the checkpoint (defaults: GLM-4.5-Air's attention, the issue's MoE)."""

    hidden: int = 4096
    experts: int = 128
    expert_width: int = 1536
    top_k: int = 8
    shared: int = 1
    heads: int = 96
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 151552
    bits: int = 2
    head_bits: int = 6
    layers: int = 8


#: ``--dry-run`` size: every rule of the real one (multiples of 128, GQA, shared expert), tiny
TINY = Spec(hidden=256, experts=8, expert_width=256, top_k=2, heads=4, kv_heads=2, head_dim=64, vocab=1024)


@dataclass(frozen=True)
class Tensor:
    """One tensor to write: name, safetensors dtype, shape, and how to fill it (``bits`` random bytes, ``signs``
    random +-scale, ``marker`` the mul1 constant, ``normal`` N(0, scale), ``ones``, ``zeros``)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    fill: str
    scale: float = 1.0

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _DTYPES[self.dtype]


def exl3_linear(prefix: str, in_f: int, out_f: int, bits: int, bias: bool = False) -> list[Tensor]:
    """An EXL3 linear as exllamav3 stores it (SPEC 1.1): trellis [I/16, O/16, 16K], suh [I], svh [O], mul1."""
    if in_f % 128 or out_f % 128:
        raise ValueError(f"{prefix}: {in_f} x {out_f} is not a multiple of 128 (SPEC 1.3)")
    out = [
        Tensor(f"{prefix}.trellis", "I16", (in_f // 16, out_f // 16, 16 * bits), "bits"),
        Tensor(f"{prefix}.suh", "F16", (in_f,), "signs", 1.0),
        Tensor(f"{prefix}.svh", "F16", (out_f,), "signs", 1.0 / math.sqrt(in_f)),
        Tensor(f"{prefix}.mul1", "I32", (), "marker"),
    ]
    if bias:
        out.append(Tensor(f"{prefix}.bias", "F16", (out_f,), "zeros"))
    return out


def layer_tensors(spec: Spec, i: int) -> list[Tensor]:
    p = f"model.layers.{i}"
    h, w, b = spec.hidden, spec.expert_width, spec.bits
    q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    out = [
        Tensor(f"{p}.input_layernorm.weight", "BF16", (h,), "ones"),
        Tensor(f"{p}.post_attention_layernorm.weight", "BF16", (h,), "ones"),
    ]
    out += exl3_linear(f"{p}.self_attn.q_proj", h, q, b, bias=True)
    out += exl3_linear(f"{p}.self_attn.k_proj", h, kv, b, bias=True)
    out += exl3_linear(f"{p}.self_attn.v_proj", h, kv, b, bias=True)
    out += exl3_linear(f"{p}.self_attn.o_proj", q, h, b)
    out += [
        Tensor(f"{p}.mlp.gate.weight", "F16", (spec.experts, h), "normal", 1.0 / math.sqrt(h)),
        Tensor(f"{p}.mlp.gate.e_score_correction_bias", "F32", (spec.experts,), "zeros"),
    ]
    for e in range(spec.experts):
        out += _mlp(f"{p}.mlp.experts.{e}", h, w, b)
    out += _mlp(f"{p}.mlp.shared_experts", h, w * spec.shared, b)
    return out


def _mlp(prefix: str, h: int, w: int, bits: int) -> list[Tensor]:
    return (
        exl3_linear(f"{prefix}.gate_proj", h, w, bits)
        + exl3_linear(f"{prefix}.up_proj", h, w, bits)
        + exl3_linear(f"{prefix}.down_proj", w, h, bits)
    )


def top_tensors(spec: Spec) -> list[Tensor]:
    return [
        Tensor("model.embed_tokens.weight", "BF16", (spec.vocab, spec.hidden), "normal", 1.0),
        Tensor("model.norm.weight", "BF16", (spec.hidden,), "ones"),
        *exl3_linear("lm_head", spec.hidden, spec.vocab, spec.head_bits),
    ]


def files(spec: Spec) -> dict[str, list[Tensor]]:
    """File name -> its tensors: the embeddings + final norm + lm_head in one file, each layer in its own."""
    out = {"model.top.safetensors": top_tensors(spec)}
    for i in range(spec.layers):
        out[f"model.layers.{i:02d}.safetensors"] = layer_tensors(spec, i)
    return out


def config_json(spec: Spec, layers: int) -> dict:
    """config.json: the keys exllamav3's ``Glm4MoeConfig`` and vLLM's ``Glm4MoeForCausalLM`` read, in the shape of
    the exllamav3-made fixtures (tests/fixtures/exl3_real/glm4moe-*), ``quantization_config`` included."""
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "attention_bias": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "first_k_dense_replace": 0,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden,
        "intermediate_size": 8 * spec.expert_width,  # the dense MLP's width: no layer has one here
        "max_position_embeddings": 131072,
        "moe_intermediate_size": spec.expert_width,
        "n_group": 1,
        "n_routed_experts": spec.experts,
        "n_shared_experts": spec.shared,
        "norm_topk_prob": True,
        "num_attention_heads": spec.heads,
        "num_experts_per_tok": spec.top_k,
        "num_hidden_layers": layers,
        "num_key_value_heads": spec.kv_heads,
        "num_nextn_predict_layers": 0,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "routed_scaling_factor": 2.5,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "use_qk_norm": False,
        "vocab_size": spec.vocab,
        "quantization_config": {
            "quant_method": "exl3",
            "version": "1.6.5",
            "bits": float(spec.bits),
            "head_bits": spec.head_bits,
            "calibration": {"rows": 0, "cols": 0},  # random trellis bits: nothing was calibrated
            "out_scales": "auto",
            "codebook": "mul1",
        },
    }


def safetensors_header(tensors: list[Tensor]) -> tuple[bytes, list[tuple[Tensor, int, int]]]:
    """The header bytes (padded to 8) and each tensor's byte range, larger elements first (so each tensor starts
    at a multiple of its own element size) and back to back (safetensors' own readers refuse gaps)."""
    ordered = sorted(tensors, key=lambda t: -_DTYPES[t.dtype])
    header: dict[str, dict] = {}
    spans = []
    off = 0
    for t in ordered:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        spans.append((t, off, off + t.nbytes))
        off += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, spans


def write_safetensors(path: Path, tensors: list[Tensor], device: str, seed: int) -> int:
    """One file from one device buffer: filled in place, copied to the host once, written, renamed into place."""
    import torch

    dt = {
        "I16": torch.int16,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "I32": torch.int32,
        "F32": torch.float32,
    }
    g = torch.Generator(device=device).manual_seed(seed)
    raw, spans = safetensors_header(tensors)
    buf = torch.empty(spans[-1][2] if spans else 0, dtype=torch.uint8, device=device)
    for t, a, b in spans:
        v = buf[a:b]
        if t.fill == "bits":
            v.random_(0, 256, generator=g)
            continue
        v = v.view(dt[t.dtype])
        if t.fill == "signs":
            v.copy_(torch.randint(0, 2, v.shape, device=device, generator=g) * (2 * t.scale) - t.scale)
        elif t.fill == "normal":
            v.normal_(0.0, t.scale, generator=g)
        elif t.fill == "marker":
            v.fill_(MUL1_MARKER)
        elif t.fill == "ones":
            v.fill_(1.0)
        elif t.fill == "zeros":
            v.zero_()
        else:
            raise ValueError(f"{t.name}: unknown fill {t.fill!r}")
    host = buf.cpu().numpy()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.write(memoryview(host))
    os.replace(tmp, path)
    return 8 + len(raw) + host.nbytes


def write_tokenizer(model_dir: Path, vocab: int) -> None:
    """A word-level tokenizer with one piece per id, so either engine can decode any id the random model emits.

    Pieces start with a space and one of them is exactly " t": exllamav3 reads its vocabulary by decoding each id
    once it has seen " t" encode to one token of that text (``Tokenizer._get_fixed_vocab``)."""
    from tokenizers import AddedToken, Tokenizer, models

    specials = ["<unk>", "<bos>", "<eos>", "<pad>"]
    pieces = {s: i for i, s in enumerate(specials)}
    pieces.update({" t" if i == FIRST_SPECIAL else f" t{i}": i for i in range(FIRST_SPECIAL, vocab)})
    tok = Tokenizer(models.WordLevel(vocab=pieces, unk_token="<unk>"))
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tok.save(str(model_dir / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "model_max_length": 131072,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")


def _stamp(spec: Spec, layers: int) -> dict:
    return {"spec": asdict(spec), "layers": layers, "config": config_json(spec, layers)}


def write_checkpoints(
    spec: Spec, depths: Iterable[int], work: Path, device: str, say: Callable[[str], None]
) -> dict[int, Path]:
    """The deepest checkpoint in full, each shallower one as hard links to its files (symlinks where the
    filesystem has no hard links). A directory whose ``stamp.json`` says the same is reused (``--write-only`` may
    have made it while the kernels built)."""
    depths = sorted(set(depths))
    full = replace(spec, layers=depths[-1])
    out = {d: work / f"L{d}" for d in depths}
    if all(_read_stamp(out[d]) == _stamp(full, d) for d in depths):
        say(f"checkpoint: reusing {', '.join(str(p) for p in out.values())}")
        return out
    deep = out[depths[-1]]
    t0 = time.monotonic()
    total = 0
    for d in depths:
        (out[d] / "stamp.json").unlink(missing_ok=True)
        out[d].mkdir(parents=True, exist_ok=True)
    for n, (name, tensors) in enumerate(files(full).items()):
        total += write_safetensors(deep / name, tensors, device, seed=1000 + n)
    _finish_dir(deep, full, depths[-1])
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()  # the engines' processes get the memory
    for d in depths[:-1]:
        for name in files(replace(full, layers=d)):
            target = out[d] / name
            target.unlink(missing_ok=True)
            try:
                os.link(deep / name, target)
            except OSError:
                target.symlink_to(deep / name)
        _finish_dir(out[d], full, d)
    say(
        f"checkpoint: {total / 1e9:.2f} GB in {len(files(full))} files written in {time.monotonic() - t0:.1f} s "
        f"({device}); depths {depths} in {work}"
    )
    return out


def _finish_dir(model_dir: Path, spec: Spec, layers: int) -> None:
    (model_dir / "config.json").write_text(json.dumps(config_json(spec, layers), indent=1) + "\n")
    write_tokenizer(model_dir, spec.vocab)
    tmp = model_dir / "stamp.json.tmp"
    tmp.write_text(json.dumps(_stamp(spec, layers)))
    os.replace(tmp, model_dir / "stamp.json")


def _read_stamp(model_dir: Path) -> dict | None:
    try:
        return json.loads((model_dir / "stamp.json").read_text())
    except (OSError, ValueError):
        return None


# -- checks of the files against both loaders (CPU) ----------------------------------------------------------------


def expected_exl3_modules(spec: Spec, layers: int) -> set[str]:
    names = [t.name for t in top_tensors(spec)]
    for i in range(layers):
        names += [t.name for t in layer_tensors(spec, i)]
    return {n.rpartition(".")[0] for n in names if n.endswith(".trellis")}


def check_plugin_names(model_dir: Path, spec: Spec, layers: int) -> str:
    """The plugin's rule (``storage.scan_checkpoint``): every linear EXL3, embeddings/norms/router plain."""
    from sparkctl_exl3.vllm_plugin import storage

    index = storage.scan_checkpoint(model_dir)
    want = expected_exl3_modules(spec, layers)
    plain = {"model.embed_tokens", "model.norm"}
    for i in range(layers):
        p = f"model.layers.{i}"
        plain |= {f"{p}.input_layernorm", f"{p}.post_attention_layernorm", f"{p}.mlp.gate"}
    bad = []
    if index.exl3 != want:
        bad.append(
            f"EXL3 modules differ: missing {sorted(want - index.exl3)[:3]}, extra {sorted(index.exl3 - want)[:3]}"
        )
    if index.plain != plain:
        bad.append(f"plain modules differ: {sorted(index.plain ^ plain)[:4]}")
    if index.legacy or index.row_codec or index.ngram:
        bad.append("legacy / row-codec / n-gram groups found")
    if bad:
        raise RuntimeError("plugin: " + "; ".join(bad))
    return f"plugin: {len(index.exl3)} EXL3 modules, {len(index.plain)} plain, {index.files} files"


def check_safetensors(model_dir: Path, spec: Spec, layers: int) -> str:
    """safetensors' own reader (vLLM loads through it) takes every file: each tensor's dtype and shape as planned,
    the markers holding the mul1 constant."""
    from safetensors import safe_open

    planned = {t.name: t for t in top_tensors(spec)}
    for i in range(layers):
        planned.update((t.name, t) for t in layer_tensors(spec, i))
    seen = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                t = planned[name]
                sl = st.get_slice(name)
                if (sl.get_dtype(), tuple(sl.get_shape())) != (t.dtype, t.shape):
                    raise RuntimeError(f"safetensors: {name} reads as {sl.get_dtype()} {sl.get_shape()}")
                if t.fill == "marker" and int(st.get_tensor(name)) != MUL1_MARKER:
                    raise RuntimeError(f"safetensors: {name} does not hold the mul1 marker")
                seen += 1
    if seen != len(planned):
        raise RuntimeError(f"safetensors: {seen} tensors stored, {len(planned)} planned")
    return f"safetensors: {seen} tensors read back as planned"


def _stub_extension() -> None:
    """exllamav3's Python side imports its CUDA extension at import time; on a CPU machine a module whose every
    function is a no-op stands in for it (as tests/fixtures/exl3_real/make_fixtures.py's dry run does)."""
    import types

    def attr(name: str) -> Callable[..., None]:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None

    stub = types.ModuleType("exllamav3_ext")
    stub.__getattr__ = attr  # type: ignore[attr-defined]
    ext_mod = types.ModuleType("exllamav3.ext")
    ext_mod.exllamav3_ext = stub  # type: ignore[attr-defined]
    sys.modules["exllamav3.ext"] = ext_mod
    sys.modules["exllamav3_ext"] = stub


def check_exllamav3_cpu(model_dir: Path, spec: Spec, layers: int) -> str:
    """exllamav3's own classes over the files, on the CPU: its config, model and tokenizer accept them, every
    EXL3 linear it builds has the stored shapes its dimensions imply, no tensor is left unclaimed, and every module
    loads (each tensor read through its safetensors loader, codebook markers checked against the constant)."""
    import torch
    from sparkctl_exl3.vllm_plugin import storage

    if importlib.util.find_spec("exllamav3") is None:
        raise ImportError("exllamav3 is not installed")
    if "exllamav3" not in sys.modules:
        _stub_extension()
    from exllamav3 import Config, Model, Tokenizer
    from exllamav3.modules import Linear

    config = Config.from_directory(str(model_dir))
    model = Model.from_config(config)
    tok = Tokenizer.from_config(config)
    if tok.actual_vocab_size != spec.vocab:
        raise RuntimeError(f"exllamav3: tokenizer vocab {tok.actual_vocab_size} != {spec.vocab}")
    shapes: dict[str, list[int]] = {}
    for f in model_dir.glob("*.safetensors"):
        shapes.update(storage.read_safetensors_shapes(f))
    claimed: set[str] = set()
    loaded = 0
    for top in model.modules:
        for m in top:
            claimed |= {s for s in shapes if s.startswith(m.key + ".")}
            if isinstance(m, Linear) and f"{m.key}.trellis" in shapes:
                i, o = m.in_features, m.out_features  # padded to 128, as the stored shapes are
                got = [shapes[f"{m.key}.trellis"][:2], shapes[f"{m.key}.suh"], shapes[f"{m.key}.svh"]]
                if got != [[i // 16, o // 16], [i], [o]]:
                    raise RuntimeError(f"exllamav3: {m.key} is {i} x {o}, stored trellis/suh/svh {got}")
            m.load(torch.device("cpu"))
            loaded += 1
            m.unload()
    unclaimed = sorted(set(shapes) - claimed)
    if unclaimed:
        raise RuntimeError(f"exllamav3: {len(unclaimed)} tensors no module reads: {unclaimed[:4]}")
    n_layers = getattr(config, "num_hidden_layers", None)
    if n_layers != layers:
        raise RuntimeError(f"exllamav3: {n_layers} layers, expected {layers}")
    return f"exllamav3: {config.architecture}, {loaded} modules loaded on the CPU, {len(shapes)} tensors all read"


def check_vllm_config(model_dir: Path) -> str:
    """vLLM builds its model config from the directory: the architecture is known and ``quant_method: exl3``
    resolves to the plugin's config."""
    from sparkctl_exl3.vllm_plugin import register
    from vllm.config import ModelConfig

    register()
    mc = ModelConfig(model=str(model_dir), tokenizer=str(model_dir), dtype="float16", max_model_len=8448)
    if mc.quantization != "exl3":
        raise RuntimeError(f"vLLM: quantization {mc.quantization!r}, expected exl3")
    return f"vLLM: {mc.architectures[0]}, quantization {mc.quantization}, {mc.hf_config.num_hidden_layers} layers"


# -- timing, engine-agnostic ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one engine run measures: TTFT at each of ``ttft`` prompt lengths, decode at each of ``batches`` after
    ``prompt`` tokens as the step between ``n1`` and ``n2`` new tokens, ``repeats`` times each."""

    prompt: int = 2048
    ttft: tuple[int, ...] = (2048, 8192)
    batches: tuple[int, ...] = (1, 8)
    repeats: int = 3
    #: more new tokens than a batch takes to get all its prefills in (~16 steps for 8 prompts of 2048 in either
    #: engine: vLLM's 2048-token steps minus the decodes, exllamav3's 1024-token shared chunks while others
    #: generate): both runs then ramp up and down the same way, and their difference is n2 - n1 full-batch steps
    n1: int = 32
    n2: int = 160
    #: after the timings, one prefill and the two decode runs again under torch's profiler (``--profile``)
    profile: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return cls(**{**d, "ttft": tuple(d["ttft"]), "batches": tuple(d["batches"])})

    @property
    def max_len(self) -> int:
        """Longest sequence a run makes (prompt + new tokens)."""
        return max(max(self.ttft) + 1, self.prompt + self.n2)


#: the device runs; ``--quick``: 2 repeats and 64 timed decode steps
FULL = Plan()
QUICK = replace(FULL, repeats=2, n2=96)
#: ``--dry-run``: vLLM's CPU build through the same driver, at sizes its reference decoder gets through in seconds
CPU_PLAN = Plan(prompt=16, ttft=(16, 48), repeats=1, n1=2, n2=4, profile=True)


def prompt_ids(n: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(FIRST_SPECIAL, vocab) for _ in range(n)]


#: kernel families of a profile, by the first pattern a kernel's name matches (lower case)
FAMILIES = (
    ("attention", re.compile(r"attn|attention|flash|paged|reshape_and_cache")),
    ("exl3 gemv / fused moe", re.compile(r"gemv|exl3_moe|exl3::moe|moe_kernel|fused_moe")),
    ("exl3 reconstruction", re.compile(r"recon")),
    ("moe routing / permute", re.compile(r"topk|moe|expert|route|permute|align|scatter|gather|index")),
    ("gemm (cuBLAS / CUTLASS)", re.compile(r"gemm|cutlass|cublas|sm90_|ampere_|kernel2|nvjet|xmma")),
    ("norm / rotary / act", re.compile(r"norm|rotary|rope|silu|gelu|act_and_mul")),
    ("elementwise / copy", re.compile(r"elementwise|copy|memcpy|memset|fill|cat|triton_poi|triton_red")),
)


def profile_table(prof: object, cuda: bool) -> dict[str, dict]:
    """What one profiled run spent, by kernel (CUDA time on a GPU, the ops' own CPU time in the dry run): name ->
    total us and calls, the 60 largest."""
    rows = []
    for e in prof.key_averages():  # type: ignore[attr-defined]
        t = (
            (getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0))
            if cuda
            else e.self_cpu_time_total
        )
        if t > 0 and (not cuda or e.device_type.name == "CUDA"):
            rows.append((e.key, float(t), int(e.count)))
    rows.sort(key=lambda r: -r[1])
    return {k: {"us": round(t, 1), "calls": c} for k, t, c in rows}


def profile_tables(prof: object, cuda: bool) -> dict[str, dict]:
    """A stopped profiler's kernel table and host table."""
    return {"kernels": profile_table(prof, cuda), "host": cpu_table(prof)}


def cpu_table(prof: object, top: int = 25) -> dict[str, dict]:
    """The host side of a profiled run: the ops and runtime calls with the most self CPU time (a GPU idle while
    the host works shows here, not in the kernel table)."""
    rows = [
        (e.key, float(e.self_cpu_time_total), int(e.count))
        for e in prof.key_averages()  # type: ignore[attr-defined]
        if e.self_cpu_time_total > 0
    ]
    rows.sort(key=lambda r: -r[1])
    return {k: {"us": round(t, 1), "calls": c} for k, t, c in rows[:top]}


def families(table: dict[str, dict], scale: float = 1.0) -> dict[str, float]:
    """A profile table summed by :data:`FAMILIES` (``scale``: e.g. 1 / decode steps)."""
    out: dict[str, float] = {}
    for name, r in table.items():
        fam = next((f for f, rx in FAMILIES if rx.search(name.lower())), "other")
        out[fam] = out.get(fam, 0.0) + r["us"] * scale
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def per_step(long: dict[str, dict], short: dict[str, dict], steps: int) -> dict[str, dict]:
    """The kernels of ``steps`` decode steps: the longer run's profile minus the shorter one's, per kernel."""
    out = {}
    for k, r in long.items():
        d = r["us"] - short.get(k, {"us": 0.0})["us"]
        if d > 0:
            out[k] = {
                "us": round(d / steps, 2),
                "calls": round((r["calls"] - short.get(k, {"calls": 0})["calls"]) / steps, 2),
            }
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us"]))


def measure(
    run: Callable[[list[list[int]], int], float],
    vocab: int,
    plan: Plan,
    say: Callable[[str], None],
    profiler: tuple[Callable[[], None], Callable[[], dict]] | None = None,
) -> dict:
    """TTFT and decode step times of one engine through ``run(prompts, new_tokens) -> wall seconds``.

    Every call gets prompts no earlier call had (a prefix cache cannot help). Decode: one step is the difference of
    the same request(s) at ``n2`` and ``n1`` new tokens over ``n2 - n1``; prefill, queueing and the stagger of a
    batch's prefills are in both and cancel."""
    seeds = iter(range(1, 1_000_000))

    def fresh(n: int, count: int = 1) -> list[list[int]]:
        return [prompt_ids(n, next(seeds), vocab) for _ in range(count)]

    for n in plan.ttft:  # untimed: first use of every shape (compilation, autotuning, graph capture)
        run(fresh(n), 1)
    for b in plan.batches:
        run(fresh(plan.prompt, b), plan.n1)
    out: dict = {"plan": asdict(plan), "ttft_ms": {}, "ttft_samples_ms": {}, "decode": {}}
    for n in plan.ttft:
        t = [run(fresh(n), 1) for _ in range(plan.repeats)]
        out["ttft_ms"][str(n)] = round(1e3 * statistics.median(t), 3)
        out["ttft_samples_ms"][str(n)] = [round(1e3 * x, 3) for x in t]
        say(f"  TTFT {n} tokens: {1e3 * statistics.median(t):.1f} ms")
    for b in plan.batches:
        steps = []
        for _ in range(plan.repeats):
            t1 = run(fresh(plan.prompt, b), plan.n1)
            t2 = run(fresh(plan.prompt, b), plan.n2)
            steps.append((t2 - t1) / (plan.n2 - plan.n1))
        step = statistics.median(steps)
        out["decode"][str(b)] = {
            "step_ms": round(1e3 * step, 4),
            "tok_s": round(b / step, 1),
            "step_samples_ms": [round(1e3 * s, 4) for s in steps],
        }
        say(f"  decode batch {b}: {1e3 * step:.3f} ms/step, {b / step:.1f} tok/s")
    if plan.profile and profiler is not None:
        # after the timings, so the profiler's own cost is in none of them
        start, stop = profiler
        prof: dict[str, dict] = {}
        wall: dict[str, float] = {}
        for label, new in (("prefill", 1), ("decode_n1", plan.n1), ("decode_n2", plan.n2)):
            start()
            wall[label] = run(fresh(plan.prompt), new)
            prof[label] = stop()
        kernels = prof["prefill"]["kernels"]
        step = per_step(prof["decode_n2"]["kernels"], prof["decode_n1"]["kernels"], plan.n2 - plan.n1)
        out["profile"] = {
            "prefill": kernels,
            "prefill_host_ops": prof["prefill"]["host"],
            # the profiled prefill's wall time against the GPU's kernel time in it: the difference is time the
            # GPU waited for the host (or the profiler's own cost, small at these kernel counts)
            "prefill_wall_ms": round(1e3 * wall["prefill"], 2),
            "prefill_kernels_ms": round(sum(r["us"] for r in kernels.values()) / 1e3, 2),
            "decode_step": step,
            "prefill_families_us": families(kernels),
            "decode_step_families_us": families(step),
        }
        say(
            f"  profile, prefill {plan.prompt}: wall {out['profile']['prefill_wall_ms']} ms, kernels "
            f"{out['profile']['prefill_kernels_ms']} ms: {out['profile']['prefill_families_us']}"
        )
        say(f"  profile, one decode step: {out['profile']['decode_step_families_us']}")
    return out


def new_profiler(cuda: bool) -> object:
    """torch's profiler over the CPU ops, and the CUDA kernels on a GPU (not started)."""
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    return torch.profiler.profile(activities=acts)


def torch_profiler(cuda: bool) -> tuple[Callable[[], None], Callable[[], dict]]:
    """Start / stop of torch's profiler in this process (exllamav3's runs, and vLLM's worker through
    ``collective_rpc``): stop returns :func:`profile_tables`."""
    import torch

    state: dict = {}

    def start() -> None:
        state["p"] = new_profiler(cuda)
        state["p"].start()

    def stop() -> dict:
        if cuda:
            torch.cuda.synchronize()
        state["p"].stop()
        return profile_tables(state["p"], cuda)

    return start, stop


def time_us(fn: Callable[[], object], device: str, calls: int = 50) -> float:
    """Mean microseconds per call over ``calls`` calls after 5 untimed: between CUDA events on a GPU."""
    import torch

    for _ in range(5):
        fn()
    if device == "cpu":
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        return 1e6 * (time.perf_counter() - t) / calls
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return 1e3 * a.elapsed_time(b) / calls


# -- exllamav3 ------------------------------------------------------------------------------------------------------


def cache_tokens(plan: Plan) -> int:
    """exllamav3's cache, a multiple of its 256-token page: the largest batch's sequences or the longest prompt,
    whichever is more, with a page of slack per sequence."""
    need = max(max(plan.batches) * (plan.prompt + plan.n2 + 256), max(plan.ttft) + 512)
    return -(-need // 256) * 256


def run_exllamav3(model_dir: Path, plan: Plan, device: str, say: Callable[[str], None]) -> dict:
    if device != "cuda":
        raise RuntimeError("exllamav3 runs on CUDA only (its extension)")
    # exllamav3's own default allocator setting (peer_exllamav3 turns it off where our ops share the process)
    os.environ["EXL3_EXPANDABLE_SEGMENTS"] = "1"
    sys.path.insert(0, str(BENCH))
    import peer_exllamav3
    import torch

    peer_exllamav3.load(allow_jit=False)
    from exllamav3 import Cache, Config, Generator, Job, Model, Tokenizer
    from exllamav3.generator.sampler import ArgmaxSampler

    rec: dict = {"engine": "exllamav3", "peer": peer_exllamav3.info()}
    t0 = time.monotonic()
    config = Config.from_directory(str(model_dir))
    model = Model.from_config(config)
    cache = Cache(model, max_num_tokens=cache_tokens(plan))
    model.load("cuda:0")
    tokenizer = Tokenizer.from_config(config)
    # prefill_cooldown 0: a waiting prompt's chunk in every iteration (its default 4 spreads a batch's prefills
    # over ~80 iterations, longer than the n1 tokens the decode difference needs the batch to be full by)
    gen = Generator(model=model, cache=cache, tokenizer=tokenizer, max_chunk_size=CHUNK, prefill_cooldown=0)
    rec.update(
        load_s=round(time.monotonic() - t0, 1),
        cache_tokens=cache_tokens(plan),
        max_chunk_size=CHUNK,
        prefill_cooldown=0,
    )
    say(f"  exllamav3 loaded in {rec['load_s']} s")
    sampler = ArgmaxSampler()

    def run(prompts: list[list[int]], new: int) -> float:
        jobs = [
            Job(input_ids=torch.tensor([p], dtype=torch.long), max_new_tokens=new, sampler=sampler)
            for p in prompts
        ]
        t = time.perf_counter()
        for j in jobs:
            gen.enqueue(j)
        done: dict[int, dict] = {}
        while gen.num_remaining_jobs():
            for r in gen.iterate():
                if r["stage"] == "error":
                    raise RuntimeError(f"exllamav3 job failed: {r.get('error', r)}")
                if r.get("eos"):
                    done[r["serial"]] = r
        dt = time.perf_counter() - t
        short = [r.get("new_tokens") for r in done.values() if r.get("new_tokens") != new]
        if len(done) != len(prompts) or short:
            raise RuntimeError(
                f"exllamav3: {len(done)} of {len(prompts)} jobs done, new tokens {short} != {new}"
            )
        return dt

    rec.update(measure(run, config.vocab_size, plan, say, torch_profiler(cuda=True)))
    head = model.modules[model.logit_layer_idx]
    rec["head_us"] = {}
    for rows in plan.batches:
        x = torch.randn(1, rows, config.hidden_size, dtype=torch.half, device="cuda:0")
        rec["head_us"][str(rows)] = round(time_us(lambda x=x: head.forward(x, {}), device), 2)
    return rec


# -- vLLM ----------------------------------------------------------------------------------------------------------


def vllm_kwargs(model_dir: Path, plan: Plan, device: str) -> dict:
    """``vllm.LLM`` arguments. CUDA: fp16 and Triton attention (what the plugin and the slimmed vLLM 0.26 run),
    vLLM's default compilation and CUDA graphs, a KV cache sized for the runs (so the start does not hang on vLLM's
    memory profile; utilisation 0.5 only has to pass its free-memory check, on a card exllamav3 has left). CPU (the
    dry run): fp32, eager. Both: chunks of :data:`CHUNK` like exllamav3's generator, prefix caching off."""
    common = {
        "model": str(model_dir),
        "max_model_len": -(-(plan.max_len + 1) // 256) * 256,
        "max_num_seqs": max(plan.batches),
        "max_num_batched_tokens": CHUNK,
        "enable_prefix_caching": False,
        "seed": 0,
    }
    if device == "cpu":
        return {**common, "dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": 256 * 2**20}
    return {
        **common,
        "dtype": "float16",
        "attention_backend": "TRITON_ATTN",
        "gpu_memory_utilization": 0.5,
        "kv_cache_memory_bytes": 8 * 2**30,
    }


def _worker_path_counts(worker: object) -> dict[str, int]:
    """Runs inside vLLM's worker (``collective_rpc``): which of our kernel paths the engine reached there."""
    from sparkctl_exl3 import paths

    return paths.counts()


def _worker_profile_start(worker: object, cuda: bool) -> None:
    """Runs inside vLLM's worker: torch's profiler on, kept on the worker object between the two calls (CUPTI sees
    the kernels of every thread and of CUDA graph replays)."""
    worker._model_speed_prof = (new_profiler(cuda), cuda)  # type: ignore[attr-defined]
    worker._model_speed_prof[0].start()  # type: ignore[attr-defined]


def _worker_profile_stop(worker: object) -> dict:
    import torch

    prof, cuda = worker._model_speed_prof  # type: ignore[attr-defined]
    if cuda:
        torch.cuda.synchronize()
    prof.stop()
    return profile_tables(prof, cuda)


#: paths that mean a layer did not run on our CUDA kernels (sparkctl_exl3.paths.PATHS)
FALLBACKS = ("linear-reference", "weight-reference", "moe-per-expert", "moe-routed-cpu")


def run_vllm(model_dir: Path, plan: Plan, device: str, say: Callable[[str], None]) -> dict:
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    rec: dict = {"engine": "vllm", "vllm": vllm.__version__}
    t0 = time.monotonic()
    kwargs = vllm_kwargs(model_dir, plan, device)
    llm = LLM(**kwargs)
    rec.update(load_s=round(time.monotonic() - t0, 1), engine_args=kwargs)
    say(f"  vLLM started in {rec['load_s']} s")

    def run(prompts: list[list[int]], new: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        dt = time.perf_counter() - t
        got = [len(o.outputs[0].token_ids) for o in outs]
        if got != [new] * len(prompts):
            raise RuntimeError(f"vLLM: new tokens {got}, expected {new} each")
        return dt

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    cuda = device == "cuda"
    worker_prof = (
        lambda: llm.collective_rpc(_worker_profile_start, args=(cuda,)),
        lambda: llm.collective_rpc(_worker_profile_stop)[0],
    )
    rec.update(measure(run, vocab, plan, say, worker_prof))
    try:
        rec["paths"] = llm.collective_rpc(_worker_path_counts)[0]
        rec["fallbacks"] = sorted(k for k in rec["paths"] if k in FALLBACKS)
    except Exception as exc:  # the counts are a diagnosis; the timings stand without them
        rec["paths"] = {"unavailable": f"{type(exc).__name__}: {str(exc)[:200]}"}
    say(f"  kernel paths reached: {rec['paths']}")
    # the lm_head alone, through the op the plugin's head calls (head_paths: our kernel, not the reference)
    import sparkctl_exl3.ops  # noqa: F401  (defines torch.ops.sparkctl_exl3.*)
    from safetensors import safe_open
    from sparkctl_exl3 import paths

    paths.reset()

    dev = "cuda:0" if device == "cuda" else "cpu"
    with safe_open(str(model_dir / "model.top.safetensors"), framework="pt", device=dev) as st:
        tr, suh, svh = (st.get_tensor(f"lm_head.{n}") for n in ("trellis", "suh", "svh"))
    dtype = torch.float16 if device == "cuda" else torch.float32
    rec["head_us"] = {}
    for rows in plan.batches:
        x = torch.randn(rows, suh.shape[0], dtype=dtype, device=dev)
        fn = lambda x=x: torch.ops.sparkctl_exl3.exl3_gemm(x, tr, suh, svh, 2)  # noqa: E731  (2: mul1)
        rec["head_us"][str(rows)] = round(time_us(fn, device, calls=50 if device == "cuda" else 3), 2)
    rec["head_paths"] = paths.counts()
    if any(k in FALLBACKS for k in rec["head_paths"]):
        rec.setdefault("fallbacks", []).append(f"lm_head alone: {sorted(rec['head_paths'])}")
    with contextlib.suppress(Exception):  # cleanup: run_child kills what lingers
        llm.llm_engine.engine_core.shutdown()  # the engine process and its GPU memory go now
    return rec


# -- the report ----------------------------------------------------------------------------------------------------


def expected_unique(experts: int, top_k: int, rows: int) -> float:
    """Expected distinct experts that ``rows`` tokens route to, each to ``top_k`` distinct of ``experts``
    uniformly at random."""
    return experts * (1.0 - (1.0 - top_k / experts) ** rows)


def layer_bytes(spec: Spec, rows: int) -> dict[str, float]:
    """Bytes one decode step of ``rows`` tokens reads from one layer's weights, by part (routed experts: the
    expected distinct ones)."""
    parts = {"attention": 0.0, "router": 0.0, "shared_expert": 0.0, "routed_experts": 0.0, "norms": 0.0}
    routed_all = 0
    for t in layer_tensors(spec, 0):
        if ".mlp.experts." in t.name:
            routed_all += t.nbytes
        elif ".self_attn." in t.name:
            parts["attention"] += t.nbytes
        elif ".mlp.gate." in t.name:
            parts["router"] += t.nbytes
        elif ".mlp.shared_experts." in t.name:
            parts["shared_expert"] += t.nbytes
        else:
            parts["norms"] += t.nbytes
    parts["routed_experts"] = routed_all / spec.experts * expected_unique(spec.experts, spec.top_k, rows)
    parts["total"] = sum(parts.values())
    return parts


def kv_bytes(spec: Spec, context: int) -> int:
    """fp16 K and V one sequence's attention reads per layer per step at ``context`` tokens."""
    return context * 2 * spec.kv_heads * spec.head_dim * 2


def head_bytes(spec: Spec) -> int:
    return sum(t.nbytes for t in top_tensors(spec) if t.name.startswith("lm_head."))


def gpu_gbs(device: str) -> tuple[float, str]:
    """The measuring GPU's bandwidth and where the figure comes from; a GPU not in :data:`GPU_GBS` (the CPU dry
    run) gets the H100's, said so."""
    for word, gbs in GPU_GBS.items():
        if word in device:
            return gbs, f"{word} ({gbs:.0f} GB/s)"
    return H100_GBS, f"{device or 'unknown'}: not in GPU_GBS, H100's {H100_GBS:.0f} GB/s assumed"


def engine_summary(runs: dict[int, dict]) -> dict:
    """One engine's per-layer decode time from its runs (``runs``: layers -> record) and its TTFTs by depth.

    Two depths or more: the slope of the step time between the shallowest and the deepest (``rest_us`` is what
    is left at 0 layers: embeddings, final norm, lm_head, sampling, host; ``host_us`` that minus the lm_head alone).
    Each depth also gets (step - lm_head alone) / layers, the only figure one depth gives: an upper bound, since
    it spreads the host overhead over the layers."""
    ok = {d: r for d, r in sorted(runs.items()) if "decode" in r}
    out: dict = {"depths": sorted(ok), "decode": {}, "ttft_ms": {}}
    if not ok:
        return out
    first = next(iter(ok.values()))
    for b in first["decode"]:
        head = statistics.mean(r["head_us"][b] for r in ok.values())
        steps = {d: 1e3 * r["decode"][b]["step_ms"] for d, r in ok.items()}
        e: dict = {
            "head_us": round(head, 2),
            "per_layer_us_naive": {
                str(d): round((s - r["head_us"][b]) / d, 2)
                for (d, s), r in zip(steps.items(), ok.values(), strict=True)
            },
        }
        if len(steps) >= 2:
            (d1, s1), (d2, s2) = min(steps.items()), max(steps.items())
            slope = (s2 - s1) / (d2 - d1)
            e.update(
                per_layer_us=round(slope, 2),
                method=f"slope between {d1} and {d2} layers",
                rest_us=round(s1 - d1 * slope, 2),
                host_us=round(s1 - d1 * slope - head, 2),
            )
        else:
            d1 = next(iter(steps))
            e.update(
                per_layer_us=e["per_layer_us_naive"][str(d1)],
                method=f"(step - lm_head alone) / {d1} layers: an upper bound, host overhead included",
                host_us=0.0,
            )
        out["decode"][b] = e
    for n in first["ttft_ms"]:
        out["ttft_ms"][n] = t = {str(d): r["ttft_ms"][n] for d, r in ok.items()}
        if len(t) >= 2:
            # prefill per layer (the slope) and what is left at 0 layers; the line read at GLM-5.3-Flash's depth
            # is the TTFT a 40-layer model of these layers would have on this GPU
            (d1, t1), (d2, t2) = (
                min(t.items(), key=lambda kv: int(kv[0])),
                max(t.items(), key=lambda kv: int(kv[0])),
            )
            slope = (t2 - t1) / (int(d2) - int(d1))
            rest = t1 - int(d1) * slope
            out.setdefault("ttft_line", {})[n] = {
                "per_layer_ms": round(slope, 3),
                "rest_ms": round(rest, 1),
                f"at_{GLM53_FLASH_LAYERS}_ms": round(rest + GLM53_FLASH_LAYERS * slope, 1),
            }
    profs = {d: r["profile"] for d, r in ok.items() if "profile" in r}
    if len(profs) >= 2:
        out["prefill_profile_line"] = profile_line(profs)
    return out


def _line(d1: int, v1: float, d2: int, v2: float) -> dict[str, float]:
    slope = (v2 - v1) / (d2 - d1)
    return {"per_layer": round(slope, 2), "at_0_layers": round(v1 - d1 * slope, 1)}


def profile_line(profs: dict[int, dict]) -> dict:
    """The profiled prefill between the shallowest and the deepest run, as per layer + at 0 layers: for the wall
    time, the GPU's kernel time and each kernel family. Where the TTFT's constant lives: a constant in the wall
    time but not in the kernels is host time; one in a family is that family's fixed work."""
    (d1, p1), (d2, p2) = min(profs.items()), max(profs.items())
    fams = dict.fromkeys([*p1["prefill_families_us"], *p2["prefill_families_us"]])
    return {
        "depths": [d1, d2],
        "wall_ms": _line(d1, p1["prefill_wall_ms"], d2, p2["prefill_wall_ms"]),
        "kernels_ms": _line(d1, p1["prefill_kernels_ms"], d2, p2["prefill_kernels_ms"]),
        "families_us": {
            f: _line(d1, p1["prefill_families_us"].get(f, 0.0), d2, p2["prefill_families_us"].get(f, 0.0))
            for f in fams
        },
    }


def projection(
    summary: dict, acceptance: float | None, gbs: float, floors: dict, head_gb10_floor_us: float
) -> dict | None:
    """GLM-5.3-Flash on one Spark: 40 layers and this lm_head at the GB10's bandwidth (this GPU's times
    ``gbs`` / 273), the host overhead as measured here. That scaling holds only for work bound by bandwidth; a layer
    measured far above its floor here is bound by latency (kernel count, occupancy), which the GB10's bandwidth does
    not slow by the same factor. So the figure is a bracket: ``tok_s`` (every microsecond scaled: the low end) and
    ``tok_s_high`` (each layer and the head at the larger of the time measured here and the GB10's floor: no
    GB10 can beat either). Only a Spark gives the number. MTP k=2: a verify step of 3 rows (per-layer time interpolated linearly between
    the 1- and 8-row steps) plus two drafts, each one MoE layer at 1 row and the lm_head; tokens per step
    1 + k * acceptance (vLLM's acceptance: accepted / drafted tokens)."""
    dec = summary.get("decode", {})
    if "1" not in dec or "per_layer_us" not in dec["1"]:
        return None
    ratio = gbs / GB10_GBS
    b1 = dec["1"]
    # a per-layer figure below the bandwidth floor is host time, not layer time (host-bound steps): the GB10 can
    # do no better than its floor, so the projection takes the floor there and says so
    clamped = [b for b in dec if dec[b].get("below_floor")]
    l1 = max(b1["per_layer_us"] * ratio, floors["1"]["gb10_floor_us"])
    head, host = b1["head_us"] * ratio, max(b1["host_us"], 0.0)
    step = GLM53_FLASH_LAYERS * l1 + head + host
    l1_high = max(b1["per_layer_us"], floors["1"]["gb10_floor_us"])
    head_high = max(b1["head_us"], head_gb10_floor_us)
    step_high = GLM53_FLASH_LAYERS * l1_high + head_high + host
    out = {
        "bandwidth_ratio": round(ratio, 3),
        "sm_ratio": round(H100_SMS / GB10_SMS, 3),
        "layer_gb10_us": round(l1, 1),
        "at_floor": sorted(clamped, key=int),
        "head_gb10_us": round(head, 1),
        "host_us": round(host, 1),
        "step_ms": round(step / 1e3, 3),
        "tok_s": round(1e6 / step, 1),
        "layer_high_us": round(l1_high, 1),
        "tok_s_high": round(1e6 / step_high, 1),
        "mtp": None,
    }
    wide = max((int(b) for b in dec), default=1)
    if acceptance is not None and wide > 1:
        lw = max(dec[str(wide)]["per_layer_us"] * ratio, floors[str(wide)]["gb10_floor_us"])
        l3 = l1 + (lw - l1) * (MTP_K + 1 - 1) / (wide - 1)
        mtp_step = GLM53_FLASH_LAYERS * l3 + head + host + MTP_K * (l1 + head)
        tokens = 1 + MTP_K * acceptance
        out["mtp"] = {
            "k": MTP_K,
            "acceptance": round(acceptance, 4),
            "tokens_per_step": round(tokens, 3),
            "verify_layer_gb10_us": round(l3, 1),
            "step_ms": round(mtp_step / 1e3, 3),
            "tok_s": round(1e6 * tokens / mtp_step, 1),
        }
    return out


def mtp_acceptance_from_records(paths: Iterable[Path]) -> tuple[float | None, str]:
    """The acceptance rate (accepted / drafted tokens, vLLM's counters) of the newest engine check record with a
    measured MTP job, or (None, 'not measured')."""
    for path in sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for r in data.get("records", []):
            c = r.get("counters") or {}
            drafts = c.get("vllm:spec_decode_num_draft_tokens") or 0
            if r.get("mode") == "mtp-k2" and drafts:
                rate = (c.get("vllm:spec_decode_num_accepted_tokens") or 0) / drafts
                return rate, f"{path.name} ({r['fixture']})"
    return None, "not measured"


def assemble(
    spec: Spec, plan: Plan, runs: dict[str, dict[int, dict]], acceptance: tuple[float | None, str], meta: dict
) -> dict:
    """The report: per engine its runs, per-layer figures and GB10 projection; the floors; the verdict."""
    gbs, gbs_source = gpu_gbs(meta.get("device", ""))
    floors = {}
    for b in plan.batches:
        lb = layer_bytes(spec, b)
        kv = b * kv_bytes(spec, plan.prompt)
        floors[str(b)] = {
            "bytes": {k: round(v) for k, v in lb.items()},
            "floor_us": round(lb["total"] / (gbs * 1e3), 2),
            "floor_with_kv_us": round((lb["total"] + kv) / (gbs * 1e3), 2),
            "gb10_floor_us": round(lb["total"] / (GB10_GBS * 1e3), 2),
        }
    report: dict = {
        "meta": meta,
        "spec": asdict(spec),
        "plan": asdict(plan),
        "head_bytes": head_bytes(spec),
        "gpu_gbs": {"value": gbs, "source": gbs_source},
        "head_floor_us": round(head_bytes(spec) / (gbs * 1e3), 2),
        "kv_bytes_per_layer": kv_bytes(spec, plan.prompt),
        "floors": floors,
        "mtp_acceptance": {"value": acceptance[0], "source": acceptance[1]},
        "engines": {},
    }
    for engine, by_depth in runs.items():
        s = engine_summary(by_depth)
        for b, e in s["decode"].items():
            if "per_layer_us" in e:
                # faster than the weights can be read: the step did not grow with the layers (host-bound, the GPU
                # work hidden under the host's), so this is no per-layer time; deeper checkpoints measure it
                e["below_floor"] = e["per_layer_us"] < floors[b]["floor_us"]
            if e.get("per_layer_us", 0) > 0:
                e["floor_fraction"] = round(floors[b]["floor_us"] / e["per_layer_us"], 3)
                e["gb10_per_layer_us"] = round(e["per_layer_us"] * gbs / GB10_GBS, 1)
        report["engines"][engine] = {
            "runs": {str(d): r for d, r in sorted(by_depth.items())},
            "summary": s,
            "glm53_flash_one_spark": projection(
                s, acceptance[0], gbs, floors, head_bytes(spec) / (GB10_GBS * 1e3)
            ),
        }
    report["verdict"] = verdict(report)
    return report


def verdict(report: dict) -> dict:
    """The issue's bounds: vLLM's per-layer decode at batch 1 at most exllamav3's; TTFT at the decode prompt
    length (2k) no worse, at the shallowest depth both measured. ``comparable``: false when merged runs came from
    different GPUs."""
    e = report["engines"]
    v = e.get("vllm", {}).get("summary", {})
    x = e.get("exllamav3", {}).get("summary", {})
    out: dict = {"comparable": not report["meta"].get("devices_differ", False)}
    lv = v.get("decode", {}).get("1", {}).get("per_layer_us")
    lx = x.get("decode", {}).get("1", {}).get("per_layer_us")
    host_bound = [
        name
        for name, x_ in (("vllm", v), ("exllamav3", x))
        if x_.get("decode", {}).get("1", {}).get("below_floor")
    ]
    out["per_layer_b1"] = (
        None
        if lv is None or lx is None
        else {
            "vllm_us": lv,
            "exllamav3_us": lx,
            # a figure under the floor is no layer time: no verdict from it (deeper checkpoints give one)
            "met": None if host_bound else lv <= lx,
            "host_bound": host_bound,
        }
    )
    n = str(report["plan"]["prompt"])
    tv, tx = v.get("ttft_ms", {}).get(n, {}), x.get("ttft_ms", {}).get(n, {})
    common = sorted(set(tv) & set(tx), key=int)
    key = f"at_{GLM53_FLASH_LAYERS}_ms"
    lv_, lx_ = v.get("ttft_line", {}).get(n), x.get("ttft_line", {}).get(n)
    if lv_ and lx_:  # both engines' lines: compare at GLM-5.3-Flash's depth
        out["ttft"] = {
            "prompt": int(n),
            "layers": GLM53_FLASH_LAYERS,
            "vllm_ms": lv_[key],
            "exllamav3_ms": lx_[key],
            "met": lv_[key] <= lx_[key],
            "method": f"each engine's TTFT line through its depths, read at {GLM53_FLASH_LAYERS} layers",
        }
        return out
    out["ttft"] = (
        None
        if not common
        else {
            "prompt": int(n),
            "layers": int(common[0]),
            "vllm_ms": tv[common[0]],
            "exllamav3_ms": tx[common[0]],
            "met": tv[common[0]] <= tx[common[0]],
        }
    )
    return out


def render(report: dict) -> str:
    """The report as text: one row per engine run, per-layer figures with their floors, projections, verdict."""
    s, plan = report["spec"], report["plan"]
    ttft, batches = [str(n) for n in plan["ttft"]], [str(b) for b in plan["batches"]]
    lines = [
        f"checkpoint: Glm4MoeForCausalLM, hidden {s['hidden']}, {s['experts']} experts x {s['expert_width']}, "
        f"top-{s['top_k']}, {s['shared']} shared, attention {s['heads']}/{s['kv_heads']} heads of {s['head_dim']}, "
        f"K={s['bits']} mul1, lm_head {s['head_bits']} bits x {s['vocab']}",
        f"meta: {json.dumps(report['meta'])}",
        f"decode after {plan['prompt']} prompt tokens, step = (T({plan['n2']}) - T({plan['n1']})) / "
        f"{plan['n2'] - plan['n1']}, median of {plan['repeats']}",
        "",
        "| engine | layers | "
        + " | ".join(f"TTFT {n} ms" for n in ttft)
        + " | "
        + " | ".join(f"b{b} ms/step | b{b} tok/s" for b in batches)
        + " | head b1 us | start s |",
        "|" + " --- |" * (4 + len(ttft) + 2 * len(batches)),
    ]
    for engine, e in report["engines"].items():
        for d, r in e["runs"].items():
            if "decode" not in r:
                lines.append(f"| {engine} | {d} | {r.get('error') or r.get('skipped')} |")
                continue
            cells = [f"{r['ttft_ms'][n]:.1f}" for n in ttft]
            cells += [f"{r['decode'][b]['step_ms']:.3f} | {r['decode'][b]['tok_s']:.1f}" for b in batches]
            cells += [f"{r['head_us']['1']:.1f}", f"{r['load_s']:.1f}"]
            lines.append(f"| {engine} | {d} | " + " | ".join(cells) + " |")
            if r.get("fallbacks"):
                lines.append(
                    f"  WARNING: {engine} {d} layers reached fallback paths {r['fallbacks']}: {r['paths']}"
                )
    gb = report.get("gpu_gbs", {"source": f"H100 ({H100_GBS:.0f} GB/s)"})
    lines += [
        "",
        f"per-layer decode, us (floors at {gb['source']}; lm_head alone: {report['head_floor_us']:.0f} us floor):",
    ]
    for engine, e in report["engines"].items():
        for b in batches:
            x = e["summary"]["decode"].get(b, {})
            if "per_layer_us" not in x:
                lines.append(f"  {engine} b{b}: not measured")
                continue
            fl = report["floors"][b]
            lines.append(
                f"  {engine} b{b}: {x['per_layer_us']:.1f} ({x['method']}); (step - head) / layers "
                f"{x['per_layer_us_naive']}; head {x['head_us']:.0f}; floor {fl['floor_us']:.1f}"
                + (f" ({100 * x['floor_fraction']:.0f} % of it)" if "floor_fraction" in x else "")
                + f", with KV {fl['floor_with_kv_us']:.1f}; GB10 {x.get('gb10_per_layer_us', math.nan):.0f} "
                f"(floor {fl['gb10_floor_us']:.0f})"
                + (" BELOW THE FLOOR: host-bound steps, not a per-layer time" if x.get("below_floor") else "")
            )
    for engine, e in report["engines"].items():
        for n, ln in e["summary"].get("ttft_line", {}).items():
            lines.append(
                f"  {engine} prefill {n}: {ln['per_layer_ms']:.2f} ms per layer + {ln['rest_ms']:.1f} ms at 0 layers"
                f" = {ln[f'at_{GLM53_FLASH_LAYERS}_ms']:.1f} ms at {GLM53_FLASH_LAYERS} layers"
            )
    for engine, e in report["engines"].items():
        pl = e["summary"].get("prefill_profile_line")
        if pl:
            lines.append(
                f"  {engine} profiled prefill {plan['prompt']}, per layer + at 0 layers: wall "
                f"{pl['wall_ms']['per_layer']} + {pl['wall_ms']['at_0_layers']} ms, GPU kernels "
                f"{pl['kernels_ms']['per_layer']} + {pl['kernels_ms']['at_0_layers']} ms; by family (us): "
                + ", ".join(
                    f"{f} {v['per_layer']} + {v['at_0_layers']}" for f, v in pl["families_us"].items()
                )
            )
        for d, r in e["runs"].items():
            pr = r.get("profile")
            if pr:
                lines.append(
                    f"  {engine} {d} layers, profiled prefill {plan['prompt']}: wall {pr['prefill_wall_ms']} ms,"
                    f" kernels {pr['prefill_kernels_ms']} ms (us): {pr['prefill_families_us']}"
                )
                lines.append(
                    f"  {engine} {d} layers, profiled prefill, top host ops (us): "
                    + ", ".join(f"{k} {v['us']:.0f}" for k, v in list(pr["prefill_host_ops"].items())[:8])
                )
                lines.append(
                    f"  {engine} {d} layers, profiled decode step (us): {pr['decode_step_families_us']}"
                )
    acc = report["mtp_acceptance"]
    lines += [
        "",
        f"GLM-5.3-Flash on one Spark (40 MoE layers at 273 GB/s; MTP acceptance {acc['value']}: {acc['source']}):",
        "  (a bracket: the low end scales every microsecond by the bandwidth ratio; the high end takes each layer",
        "  and the head at the larger of the time measured here and the GB10's floor; only a Spark gives the number)",
    ]
    for engine, e in report["engines"].items():
        p = e["glm53_flash_one_spark"]
        if p is None:
            lines.append(f"  {engine}: no per-layer figure")
            continue
        mtp = p["mtp"]
        lines.append(
            f"  {engine}: {p['tok_s']:.1f} to {p['tok_s_high']:.1f} tok/s (low end {p['step_ms']:.2f} ms/token = 40 x {p['layer_gb10_us']:.0f} us "
            f"+ head {p['head_gb10_us']:.0f} + host {p['host_us']:.0f}"
            + (f"; layer at the GB10 floor for b{','.join(p['at_floor'])}" if p.get("at_floor") else "")
            + "); with MTP k=2: "
            + (
                f"{mtp['tok_s']:.1f} tok/s ({mtp['tokens_per_step']} tokens per {mtp['step_ms']:.2f} ms step)"
                if mtp
                else "not measured"
            )
        )
    v = report["verdict"]
    pl, tt = v["per_layer_b1"], v["ttft"]
    if report["meta"].get("devices_differ"):
        lines += ["", f"NOTE: merged runs from different GPUs ({report['meta']['device']}): not comparable"]
    lines += [
        "",
        "verdict: per-layer decode b1 "
        + (
            "not measured"
            if pl is None
            else f"vLLM {pl['vllm_us']:.1f} vs exllamav3 {pl['exllamav3_us']:.1f} us: "
            + (
                f"NO VERDICT ({', '.join(pl['host_bound'])} below the bandwidth floor: host-bound steps)"
                if pl["met"] is None
                else "MET"
                if pl["met"]
                else "NOT MET"
            )
        )
        + "; TTFT "
        + (
            "not measured"
            if tt is None
            else f"{tt['prompt']} at {tt['layers']} layers: vLLM {tt['vllm_ms']:.1f} vs exllamav3 "
            f"{tt['exllamav3_ms']:.1f} ms"
            + (f" ({tt['method']})" if "method" in tt else "")
            + ": "
            + ("MET" if tt["met"] else "NOT MET")
        ),
    ]
    return "\n".join(lines) + "\n"


# -- the driver ----------------------------------------------------------------------------------------------------


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def child(job: dict) -> int:
    """One engine at one depth in its own process (its GPU memory goes with it): writes its record, or the error,
    to ``job['result']``."""

    def say(s: str) -> None:
        print(s, flush=True)

    try:
        fn = run_exllamav3 if job["engine"] == "exllamav3" else run_vllm
        rec = fn(Path(job["model"]), Plan.from_dict(job["plan"]), job["device"], say)
    except Exception as exc:
        traceback.print_exc()
        rec = {"engine": job["engine"], "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    _atomic_write(Path(job["result"]), json.dumps(rec))
    return 0


def run_child(job: dict, log: Path, timeout: float) -> dict:
    """One child, in its own process group: killed with everything it started (vLLM's engine core) when it runs
    past ``timeout`` or lingers 30 s after writing its record, so the next engine finds the GPU free."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "kernels"), os.environ.get("PYTHONPATH")) if p)
    # the slimmed vLLM has no FlashInfer (engine_pack.py); the path counts come back through collective_rpc
    env.update(VLLM_USE_FLASHINFER_SAMPLER="0", VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    res = Path(job["result"])
    res.unlink(missing_ok=True)
    t0 = time.monotonic()
    written = None
    with open(log, "w") as fh:
        argv = [sys.executable, __file__, "--child", json.dumps(job)]
        p = subprocess.Popen(argv, stdout=fh, stderr=fh, env=env, start_new_session=True)
        while p.poll() is None:
            now = time.monotonic()
            if written is None and res.exists():
                written = now
            if now - t0 > timeout or (written is not None and now - written > 30):
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                break
            time.sleep(0.5)
    if res.exists():
        rec = json.loads(res.read_text())
        res.unlink()
    else:
        tail = log.read_text(errors="replace").strip().splitlines()
        rec = {
            "engine": job["engine"],
            "error": f"exit {p.returncode} after {time.monotonic() - t0:.0f} s (limit {timeout:.0f}): "
            + (tail[-1] if tail else ""),
        }
    rec["wall_s"] = round(time.monotonic() - t0, 1)
    return rec


def run_engines(
    engines: list[str],
    dirs: dict[int, Path],
    plan: Plan,
    device: str,
    out: Path,
    deadline: float,
    say: Callable[[str], None],
) -> dict[str, dict[int, dict]]:
    """Each engine at each depth, one process after the other, shallowest depth first (both engines there before
    either goes deeper); a run that would start with under 45 s to ``deadline`` is skipped."""
    caps = {"exllamav3": 150.0, "vllm": 240.0}
    runs: dict[str, dict[int, dict]] = {e: {} for e in engines}
    for d, model_dir in sorted(dirs.items()):
        for engine in engines:
            left = deadline - time.monotonic()
            if left < 45:
                runs[engine][d] = {"engine": engine, "skipped": "time budget spent"}
                say(f"{engine} at {d} layers: skipped (time budget)")
                continue
            say(f"{engine} at {d} layers: starting")
            job = {
                "engine": engine,
                "model": str(model_dir),
                "plan": asdict(plan),
                "device": device,
                "result": str(out / f"{engine}-L{d}.result.json"),
            }
            rec = run_child(job, out / f"{engine}-L{d}.log", min(caps[engine], left))
            runs[engine][d] = rec
            say(
                f"{engine} at {d} layers: "
                + (f"FAILED: {rec['error']}" if "error" in rec else f"{rec['wall_s']} s")
            )
    return runs


def _depths(text: str) -> list[int]:
    try:
        d = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        d = []
    if not d or d[0] < 1:
        raise argparse.ArgumentTypeError(f"wants layer counts like 4,8, got {text!r}")
    return d


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, help="where the report and the engines' logs go")
    ap.add_argument("--work", type=Path, help="where the checkpoints go (default /tmp/model_speed)")
    ap.add_argument(
        "--layers", type=_depths, default=[4, 8], help="depths to measure, e.g. 4,8 (default) or 4"
    )
    ap.add_argument(
        "--quick", action="store_true", help="2 repeats and 64 timed decode steps (else 3 and 128)"
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after the timings, profile one prefill and one decode step per run (torch profiler, kernel families)",
    )
    ap.add_argument("--engines", default="exllamav3,vllm", help="exllamav3,vllm (default) or one of them")
    ap.add_argument(
        "--write-only", action="store_true", help="write (and on the CPU check) the checkpoints, stop"
    )
    ap.add_argument("--mtp-acceptance", type=float, help="MTP k=2 acceptance for the projection (0..1)")
    ap.add_argument(
        "--budget-s", type=float, default=400.0, help="no engine run starts after this (default 400)"
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="CPU: tiny checkpoint, loader checks, vLLM's CPU build"
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="one report from the model_speed.json of runs made in separate calls (one engine each)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = _args(argv)
    except SystemExit as exc:
        return 0 if exc.code in (0, None) else 2
    if args.child:
        return child(json.loads(args.child))
    engines = [e for e in args.engines.split(",") if e]
    bad = None
    if args.out is None and not args.write_only:
        bad = "--out DIR is required"
    elif not engines or set(engines) - {"exllamav3", "vllm"}:
        bad = f"--engines takes exllamav3 and/or vllm, got {args.engines!r}"
    elif args.mtp_acceptance is not None and not 0.0 <= args.mtp_acceptance <= 1.0:
        bad = f"--mtp-acceptance must be in [0, 1], got {args.mtp_acceptance}"
    if bad:
        print(f"model speed: {bad}")
        return 2
    if args.merge:
        return merge(args.merge, args.out, args.mtp_acceptance)
    t0 = time.monotonic()

    def say(s: str) -> None:
        print(f"[{time.monotonic() - t0:5.0f}s] {s}", flush=True)

    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("model speed: no CUDA device (--dry-run runs the CPU half)")
        return 2
    device = "cpu" if args.dry_run else "cuda"
    spec = replace(TINY if args.dry_run else Spec(), layers=max(args.layers))
    work = args.work or (
        Path(tempfile.mkdtemp(prefix="model_speed_")) if args.dry_run else Path("/tmp/model_speed")
    )
    dirs = write_checkpoints(spec, args.layers, work, device, say)
    checks = check_checkpoints(dirs, spec, say) if args.dry_run else {}
    failed = sum(v.startswith("FAILED") for v in checks.values())
    if args.write_only:
        return 1 if failed else 0
    plan = CPU_PLAN if args.dry_run else QUICK if args.quick else FULL
    if args.profile:
        plan = replace(plan, profile=True)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    runnable = [e for e in engines if not (args.dry_run and e == "exllamav3")]
    runs = run_engines(runnable, dirs, plan, device, out, t0 + args.budget_s, say)
    if args.dry_run and "exllamav3" in engines:
        why = "dry run: exllamav3 runs on CUDA only; its loader was checked on the CPU"
        runs["exllamav3"] = {d: {"engine": "exllamav3", "skipped": why} for d in dirs}
    failed += sum("decode" not in r for e in runnable for r in runs[e].values())
    acceptance = (
        (args.mtp_acceptance, "--mtp-acceptance")
        if args.mtp_acceptance is not None
        else mtp_acceptance_from_records(RECORDS.glob("engine_check*.json"))
    )
    meta = {
        "device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "quick": args.quick,
        "chunk": CHUNK,
        "checks": checks,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    report = assemble(spec, plan, runs, acceptance, meta)
    _atomic_write(out / "model_speed.json", json.dumps(report, indent=1) + "\n")
    text = render(report)
    _atomic_write(out / "model_speed.txt", text)
    print(text, flush=True)
    return 1 if failed else 0


def merge(paths: list[Path], out: Path, mtp_acceptance: float | None) -> int:
    """One report from reports of separate device calls (exllamav3 in one, vLLM in the other, when both engines'
    carried files do not fit one call): same checkpoint spec and plan required; runs on different GPUs are merged
    but the verdict says they are not comparable."""
    try:
        reports = [json.loads(p.read_text()) for p in paths]
    except (OSError, ValueError) as exc:
        print(f"model speed: cannot read a report to merge: {exc}")
        return 2
    first = reports[0]
    if any((r.get("spec"), r.get("plan")) != (first.get("spec"), first.get("plan")) for r in reports):
        print("model speed: the reports to merge differ in checkpoint spec or plan")
        return 2
    runs: dict[str, dict[int, dict]] = {}
    for path, r in zip(paths, reports, strict=True):
        for engine, e in r["engines"].items():
            measured = {int(d): x for d, x in e["runs"].items() if "decode" in x}
            if engine in runs and measured and any("decode" in x for x in runs[engine].values()):
                print(f"model speed: {engine} was measured in more than one report ({path})")
                return 2
            if measured or engine not in runs:
                runs[engine] = {int(d): x for d, x in e["runs"].items()}
    devices = sorted({r["meta"].get("device", "?") for r in reports})
    meta = {
        "merged": [str(p) for p in paths],
        "device": " + ".join(devices),
        "devices_differ": len(devices) > 1,
    }
    acc = first["mtp_acceptance"]
    acceptance = (
        (mtp_acceptance, "--mtp-acceptance") if mtp_acceptance is not None else (acc["value"], acc["source"])
    )
    report = assemble(Spec(**first["spec"]), Plan.from_dict(first["plan"]), runs, acceptance, meta)
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / "model_speed.json", json.dumps(report, indent=1) + "\n")
    text = render(report)
    _atomic_write(out / "model_speed.txt", text)
    print(text, end="")
    return 0


def check_checkpoints(dirs: dict[int, Path], spec: Spec, say: Callable[[str], None]) -> dict[str, str]:
    """The dry run's checks of every depth: safetensors' reader, the plugin's name rules, exllamav3's loader, vLLM's
    model config. A check whose library is not installed says so and does not fail."""
    checks: dict[str, str] = {}
    for d, model_dir in dirs.items():
        for name, fn in (
            ("safetensors", check_safetensors),
            ("plugin", check_plugin_names),
            ("exllamav3", check_exllamav3_cpu),
            ("vllm", lambda m, _s, _d: check_vllm_config(m)),
        ):
            key = f"L{d}.{name}"
            try:
                checks[key] = fn(model_dir, spec, d)
            except ImportError as exc:
                checks[key] = f"not checked: {exc}"
            except Exception as exc:
                checks[key] = f"FAILED: {type(exc).__name__}: {exc}"
            say(f"{d} layers: {checks[key]}")
    return checks


if __name__ == "__main__":
    sys.exit(main())
