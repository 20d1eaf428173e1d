"""The memory plan: does weights + KV cache + runtime overhead fit the pool the engine sees?

On a DGX Spark CPU, GPU and page cache share one 128 GB pool (121.69 GiB visible to CUDA), and vLLM's
`--gpu-memory-utilization` is a fraction of that whole pool. The KV cache gets what is left after the
weights and the runtime overhead, so a pack that leaves no room for one full-length sequence makes vLLM
refuse at start-up, after a 10-minute load. The planner does the same arithmetic in milliseconds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkctl.planner.types import MemoryPlan
from sparkctl.recipe.schema import Recipe

GiB = 1024**3
# What a GB10 reports as total device memory: 128 GB of LPDDR5X shows up as ~121.69 GiB.
SPARK_POOL_BYTES = 130_663_642_562
VLLM_DEFAULT_UTILIZATION = 0.92
DEFAULT_OVERHEAD = {"cuda": 5 * GiB, "cpu": 2 * GiB}

# bytes per KV element by dtype name (vLLM and llama.cpp spellings); q8_0/q4_0 carry a scale per 32
_DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "f32": 4,
    "bfloat16": 2,
    "float16": 2,
    "bf16": 2,
    "f16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt")


@dataclass(frozen=True)
class MemoryCheck:
    """The plan plus the reasons it cannot work (`problems`) or is tight (`warnings`)."""

    plan: MemoryPlan
    problems: tuple[str, ...]
    warnings: tuple[str, ...]


def gib(n: float) -> str:
    if 0 < n < GiB / 10:  # a tiny model: "0.00 GiB" would say nothing
        return f"{n / 2**20:.1f} MiB"
    return f"{n / GiB:.2f} GiB"


def host_memory_bytes() -> int:
    """Physical RAM from sysconf: no psutil import on the planning path."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 0


def kv_element_bytes(recipe: Recipe) -> float:
    """Bytes per cached element at the serving KV dtype ('auto' follows the model dtype)."""
    dtype = recipe.serve.kv_cache_dtype
    if dtype == "auto":
        dtype = "float32" if recipe.serve.dtype == "float32" else "bfloat16"
    from sparkctl.planner.adapters import adapter_for

    dtype = adapter_for(recipe.engine.name).kv_dtype(recipe, dtype)
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        return 2.0  # unknown/exotic dtypes (nvfp4, turboquant, ...): assume 16-bit, an upper bound


@dataclass(frozen=True)
class KVShape:
    """Attention geometry read from a model's config.json (same meaning as the recipe's model.kv)."""

    layers: int
    kv_heads: int | None = None
    head_dim: int | None = None
    mla_dim: int | None = None
    bytes_per_token: int | None = None


def _int(cfg: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def read_model_config(model_dir: str | None) -> dict[str, Any] | None:
    """A local Hugging Face model directory's config.json, or None when it cannot be read (planner.facts)."""
    if not model_dir:
        return None
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def kv_shape_from_config(model_dir: str | None) -> KVShape | None:
    """The KV geometry of a local Hugging Face model directory, or None when it cannot be read."""
    return kv_shape(read_model_config(model_dir))


def kv_shape(cfg: dict[str, Any] | None) -> KVShape | None:
    """The KV geometry a model config describes, or None.

    Covers the layouts our recipes serve: GQA/MHA (num_key_value_heads x head_dim), MLA (kv_lora_rank +
    qk_rope_head_dim per layer), hybrids whose `layer_types` / `full_attention_interval` mark which
    layers keep a KV cache, and multimodal configs that nest the language model under `text_config`.
    """
    if cfg is None:
        return None
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    if layers is None:
        return None
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        full = sum(1 for t in types if t in ("full_attention", "attention", "sliding_attention"))
        layers = full or layers
    elif (interval := _int(cfg, "full_attention_interval")) is not None:
        layers = layers // interval
    lora, rope = _int(cfg, "kv_lora_rank"), _int(cfg, "qk_rope_head_dim")
    if lora is not None and rope is not None:
        return KVShape(layers=layers, mla_dim=lora + rope)
    heads = _int(cfg, "num_attention_heads", "n_head")
    kv_heads = _int(cfg, "num_key_value_heads", "n_head_kv") or heads
    head_dim = _int(cfg, "head_dim")
    if head_dim is None and heads is not None and (hidden := _int(cfg, "hidden_size", "n_embd")):
        head_dim = hidden // heads
    if kv_heads is None or head_dim is None:
        return None
    return KVShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim)


def kv_bytes_per_token(recipe: Recipe, shape: KVShape | None = None) -> int:
    """KV bytes one token of context costs on one node, or 0 when the geometry is unknown.

    The recipe's `model.kv` wins; `shape` (read from the model's config.json) fills in when it is unset.
    """
    geo = recipe.model.kv or shape
    if geo is None:
        return 0
    if geo.bytes_per_token is not None:
        return geo.bytes_per_token
    elem = kv_element_bytes(recipe)
    if geo.mla_dim is not None:
        # MLA caches one latent per token per layer, replicated on every tensor-parallel rank
        per_layer = geo.mla_dim * elem
    else:
        tp = recipe.cluster.tensor_parallel
        heads = max(1, geo.kv_heads // tp)  # KV heads split over TP ranks, replicated when fewer than ranks
        per_layer = 2 * heads * geo.head_dim * elem
    layers = geo.layers
    if recipe.cluster.pipeline_parallel > 1:
        layers = -(-layers // recipe.cluster.pipeline_parallel)
    return int(round(per_layer * layers))


def weights_on_disk(model_path: str | None) -> int | None:
    """Sum of weight files in a local model directory (or one file), None when there is nothing to read."""
    if not model_path:
        return None
    p = Path(model_path)
    try:
        if p.is_file():
            return p.stat().st_size
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and f.suffix in WEIGHT_SUFFIXES)
    except OSError:
        return None
    return None


def plan_memory(
    recipe: Recipe,
    *,
    model_config: dict[str, Any] | None = None,
    weights_bytes: int | None = None,
    host_bytes: int = 0,
) -> MemoryCheck:
    """Weights + KV + overhead against the pool; per node when the model is split across Sparks. Pure:
    the model's config and size on disk and the host's RAM come from planner.facts."""
    device = recipe.engine.device
    mem = recipe.memory
    serve = recipe.serve
    notes: list[str] = []
    problems: list[str] = []
    warnings: list[str] = []
    ranks = recipe.cluster.tensor_parallel * recipe.cluster.pipeline_parallel

    if mem.pool_bytes is not None:
        total = mem.pool_bytes
        pool_name = "the configured pool"
    elif device == "cuda":
        total = SPARK_POOL_BYTES
        pool_name = "the DGX Spark unified pool (128 GB, 121.69 GiB visible)"
    else:
        total = host_bytes
        pool_name = "this host's RAM"
    notes.append(f"pool: {gib(total)}, {pool_name}" + (" per node" if ranks > 1 else ""))

    if mem.weights_bytes is not None:
        weights = mem.weights_bytes
        per_node = " per node" if ranks > 1 else ""
        notes.append(f"weights: {gib(weights)} resident{per_node} (memory.weights_bytes)")
    else:
        on_disk = recipe.model.expected_bytes or weights_bytes
        if on_disk:
            weights = -(-on_disk // ranks)
            split = f", split over {ranks} ranks" if ranks > 1 else ""
            notes.append(f"weights: {gib(weights)} from the files on disk{split}")
        else:
            weights = 0
            what = "generated on first use" if recipe.model.generate else "unknown"
            notes.append(
                f"weights: size {what}; counted as 0 until the model exists (pass its path to plan it)"
            )

    overhead = mem.overhead_bytes if mem.overhead_bytes is not None else DEFAULT_OVERHEAD[device]
    shape = None if recipe.model.kv is not None else kv_shape(model_config)
    per_token = kv_bytes_per_token(recipe, shape)
    if shape is not None and per_token:
        notes.append(f"kv geometry from the model's config.json: {per_token:,} B/token")
    need_tokens = serve.max_model_len

    from sparkctl.planner.adapters import adapter_for

    engine = adapter_for(recipe.engine.name)
    if engine.kv_up_front:
        # llama-server allocates the whole -c context up front: max_model_len for each of its -np slots;
        # FreeToken sizes its KV from free memory, counted here as the same max_model_len per sequence
        need_tokens = serve.max_model_len * (serve.max_num_seqs or 1)
        kv = need_tokens * per_token
        budget = weights + kv + overhead
        if per_token:
            notes.append(
                f"kv cache: {need_tokens:,} tokens x {per_token:,} B allocated up front by {engine.kv_owner}"
            )
    elif serve.kv_cache_memory_bytes is not None:
        kv = serve.kv_cache_memory_bytes
        budget = weights + kv + overhead
        notes.append(
            f"kv cache: {gib(kv)} fixed by kv_cache_memory_bytes (no profiling, utilisation ignored)"
        )
    else:
        util = serve.gpu_memory_utilization
        if util is None:
            util = VLLM_DEFAULT_UTILIZATION
            notes.append(f"gpu_memory_utilization not set: vLLM's default {util} applies")
        if mem.max_utilization is not None and util > mem.max_utilization:
            problems.append(
                f"gpu_memory_utilization {util} is above this recipe's limit {mem.max_utilization} "
                "(known to fail with NV_ERR_NO_MEMORY above it)"
            )
        budget = int(util * total)
        kv = budget - weights - overhead
        notes.append(
            f"budget: {util} x {gib(total)} = {gib(budget)}; kv cache gets what weights "
            f"({gib(weights)}) and overhead ({gib(overhead)}) leave: {gib(kv)}"
        )
        if device == "cuda":
            notes.append(
                "vLLM checks the budget against free memory at start; on GB10 page cache counts as used, "
                "so cached shards must be evicted first"
            )

    max_tokens = kv // per_token if per_token and kv > 0 else 0
    if per_token == 0:
        notes.append("kv bytes per token unknown (model.kv not set): context capacity not checked")

    if kv <= 0 and not (engine.kv_up_front and per_token == 0):
        problems.append(
            f"no room for a KV cache: weights {gib(weights)} + overhead {gib(overhead)} exceed the "
            f"engine budget {gib(budget)}"
        )
    elif per_token and max_tokens < need_tokens:
        problems.append(
            f"the KV cache ({gib(kv)}) holds {max_tokens:,} tokens at {per_token:,} B/token, fewer than "
            f"max_model_len {need_tokens:,} (needs {gib(need_tokens * per_token)})"
        )
    if budget > total:
        problems.append(f"the plan needs {gib(budget)} but the pool is {gib(total)}")
    elif total - budget < mem.min_free_bytes:
        warnings.append(
            f"only {gib(total - budget)} of {gib(total)} left outside the engine for the OS, page cache and "
            f"CPU side (recipe asks for {gib(mem.min_free_bytes)})"
        )
    if per_token and kv > 0 and max_tokens >= need_tokens:
        seqs = max_tokens // serve.max_model_len
        notes.append(
            f"kv cache holds {max_tokens:,} tokens = {seqs} full-length sequence(s) of {serve.max_model_len:,}"
        )

    plan = MemoryPlan(
        total_bytes=total,
        budget_bytes=budget,
        weights_bytes=weights,
        kv_cache_bytes=max(kv, 0),
        kv_bytes_per_token=per_token,
        runtime_overhead_bytes=overhead,
        max_context_tokens=max_tokens,
        fits=not problems,
        notes=tuple(notes),
    )
    return MemoryCheck(plan=plan, problems=tuple(problems), warnings=tuple(warnings))
