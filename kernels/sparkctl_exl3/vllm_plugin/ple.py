"""The n-gram (PLE) embedding table of Qwen4Exp kept packed: vLLM's PLE layer with our storage and lookup.

vLLM's Qwen4Exp builds its per-layer n-gram embedding as a vocab-parallel table of ``rows x head_dim`` in the
model dtype and picks the table's storage through ``Qwen4ExpPLEEmbeddingMethod.from_quant_config``, which knows
FP8/NVFP4 only: under an EXL3 config vLLM 0.32 raises NotImplementedError and 0.33 falls back to a dense table
(~95 GiB for Qwen3.8-Flash-Next: an out-of-memory error at load). :class:`EXL3NgramEmbeddingMethod` is the method
our hook (``qwen4_exp.exl3_construction``) hands out instead for tables the checkpoint stores in exllamav3's
``exl3_ngram_trellis`` codec: the table's parameter is the packed int16 rows themselves (30.4 GiB), every shard
of the checkpoint is copied into its row range as it loads, and a lookup decodes only the rows it needs
(``torch.ops.sparkctl_exl3.ngram_lookup``: the CUDA kernel on the GPU, the reference elsewhere).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import torch
from torch import nn
from vllm.model_executor.utils import set_weight_attrs
from vllm.models.qwen4_exp.common.ngram_embedding import (
    Qwen4ExpPLEEmbeddingMethod,
    Qwen4ExpPLEPinnedHostEmbedding,
)

from .. import ngram, ngram_cuda  # noqa: F401  (ngram_cuda registers the op's CUDA kernel)
from .forward import Exl3LoadError
from .storage import NgramTableInfo

logger = logging.getLogger("sparkctl_exl3.vllm_plugin")

#: The table's small tensors (SPEC of the codec: sparkctl_exl3/ngram.py), with their dtypes.
AUX_TENSORS: dict[str, torch.dtype] = {
    "head_bias": torch.float16,
    "head_offsets": torch.int64,
    "head_vocab_sizes": torch.int64,
    "layer_multipliers": torch.int64,
}

GIB = 1 << 30


class _NgramShard(nn.Module):
    """Holds the placeholder ``trellis`` parameter checkpoint tensor ``<table>.shard_<n>.trellis`` loads into."""


class EXL3NgramEmbeddingMethod(Qwen4ExpPLEEmbeddingMethod):
    """Packed storage and row-wise decoding for an ``exl3_ngram_trellis`` PLE table (tensor-parallel size 1)."""

    def __init__(self, prefix: str, info: NgramTableInfo) -> None:
        self.prefix = prefix
        self.info = info

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        info = self.info
        if isinstance(layer, Qwen4ExpPLEPinnedHostEmbedding):
            raise Exl3LoadError(
                f"{self.prefix}: the packed EXL3 n-gram table stays on the device (30.4 GiB instead of 95 for "
                "Qwen3.8-Flash-Next); drop the engram CPU-offload option"
            )
        if int(getattr(layer, "tp_size", 1)) != 1:
            raise Exl3LoadError(
                f"{self.prefix}: splitting the packed EXL3 n-gram table across {layer.tp_size} ranks is not "
                "supported; serve it with tensor-parallel size 1"
            )
        if info.dim != input_size_per_partition:
            raise Exl3LoadError(
                f"{self.prefix}: the checkpoint's n-gram rows hold {info.dim} values but the model's PLE head "
                f"dimension is {input_size_per_partition} (config.json ple_embed_dim / n-gram heads)"
            )
        if ngram.bits_of_or_none(info.words, info.dim) is None:
            raise Exl3LoadError(
                f"{self.prefix}: n-gram rows of {info.words} int16 words are not {info.dim}-wide rings at K 1..8"
            )
        # The packed rows are the table's weight: allocated once where vLLM puts the table (the device).
        weight = nn.Parameter(
            layer.allocate_embedding_weight(info.rows, info.words, torch.int16), requires_grad=False
        )
        layer.register_parameter("weight", weight)
        layer.exl3_loaded = set()
        start = 0
        for n, rows in enumerate(info.shard_rows):
            holder = layer
            name = "trellis"
            if info.sharded:
                holder = _NgramShard()
                layer.add_module(f"shard_{n}", holder)
            param = nn.Parameter(torch.empty(0, dtype=torch.int16), requires_grad=False)
            holder.register_parameter(name, param)
            set_weight_attrs(param, {"weight_loader": partial(self._load_rows, layer, n, start, rows)})
            start += rows
        for name, dtype in AUX_TENSORS.items():
            param = nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, param)
            set_weight_attrs(param, {"weight_loader": partial(self._load_aux, layer, name)})

    def _load_rows(
        self, layer: nn.Module, n: int, start: int, rows: int, param: nn.Parameter, loaded: torch.Tensor
    ) -> None:
        """Copy one checkpoint shard into its row range of the packed table (no second copy of the table)."""
        label = f"{self.prefix}.shard_{n}.trellis" if self.info.sharded else f"{self.prefix}.trellis"
        want = (rows, self.info.words)
        if loaded.dtype != torch.int16 or tuple(loaded.shape) != want:
            raise Exl3LoadError(
                f"{label}: expected int16 {list(want)}, got {loaded.dtype} {list(loaded.shape)}"
            )
        layer.weight.data.narrow(0, start, rows).copy_(loaded)
        layer.exl3_loaded.add(f"shard_{n}")

    def _load_aux(self, layer: nn.Module, name: str, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data = loaded.to(device=layer.weight.device, dtype=AUX_TENSORS[name]).contiguous()
        layer.exl3_loaded.add(name)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        info = self.info
        want = {f"shard_{n}" for n in range(len(info.shard_rows))} | set(AUX_TENSORS)
        missing = sorted(want - layer.exl3_loaded)
        if missing:
            raise Exl3LoadError(
                f"{self.prefix}: the checkpoint did not provide "
                f"{', '.join(f'{self.prefix}.{m}' for m in missing)} (is ngram_embedding.safetensors listed "
                "in model.safetensors.index.json? `sparkctl prepare` regenerates the index)"
            )
        try:
            table = self.table(layer)
        except ValueError as exc:
            raise Exl3LoadError(f"{self.prefix}: {exc}") from None
        if layer.weight.is_cuda:
            ngram_cuda.available()  # build or load the kernel now, not inside a CUDA-graph capture
        logger.info(
            "exl3 n-gram table %s: %d rows x %d at K=%d kept packed on %s: %.2f GiB resident (dense bf16 %.2f GiB)",
            self.prefix,
            table.num_rows,
            info.dim,
            table.bits,
            layer.weight.device,
            table.resident_bytes / GIB,
            table.dense_bytes / GIB,
        )

    def table(self, layer: nn.Module) -> ngram.NgramTable:
        """The loaded table as the codec's :class:`~sparkctl_exl3.ngram.NgramTable` (one shard: the weight)."""
        return ngram.NgramTable(
            shards=[layer.weight],
            head_bias=layer.head_bias,
            head_offsets=layer.head_offsets,
            head_vocab_sizes=layer.head_vocab_sizes,
            layer_multipliers=layer.layer_multipliers,
        )

    def embedding(self, layer: nn.Module, input_: torch.Tensor) -> torch.Tensor:
        rows = input_.reshape(-1).to(torch.int64)
        out = torch.ops.sparkctl_exl3.ngram_lookup(
            rows, [layer.weight], layer.head_offsets, layer.head_bias, int(layer.weight.shape[0])
        )
        return out.view(*input_.shape, self.info.dim)

    def lookup_dtype(self, layer: nn.Module) -> torch.dtype:
        return torch.float16

    def dequantize(
        self, layer: nn.Module, embeddings: torch.Tensor, output_dtype: torch.dtype
    ) -> torch.Tensor:
        return embeddings.to(output_dtype)  # the lookup already decoded the rows


def check_ngram_hashing(module: nn.Module) -> None:
    """Refuse a pack whose hashing disagrees with the n-gram ids vLLM computes (one clear line).

    ``module`` is vLLM's ``Qwen4ExpNGramEmbedding``: it hashes token n-grams into rows with its own head offsets,
    head sizes and multipliers (computed from config.json, or loaded from the checkpoint). The packed table's rows
    were laid out with the pack's own; if they differ, every lookup would read another n-gram's row.
    """
    table = getattr(module, "ngram_embedding", None)
    method = getattr(table, "embedding_method", None)
    if not isinstance(method, EXL3NgramEmbeddingMethod):
        return
    for ours, theirs in (
        ("head_offsets", "ngram_heads_offsets"),
        ("head_vocab_sizes", "ngram_heads_vocab_sizes"),
        ("layer_multipliers", "layer_multipliers"),
    ):
        pack = getattr(table, ours).detach().cpu().to(torch.int64)
        vllm = getattr(module, theirs).detach().cpu().to(torch.int64)
        if pack.shape != vllm.shape or not torch.equal(pack, vllm):
            raise Exl3LoadError(
                f"{method.prefix}: the pack's n-gram {ours} {_short(pack)} differ from the {theirs} vLLM computes "
                f"{_short(vllm)} (config.json ngram_size / heads_per_ngram / ngram_vocab_size_base / seed): the "
                "table would be read at the wrong rows"
            )


def _short(t: torch.Tensor) -> str:
    values = t.reshape(-1).tolist()
    return str(values) if len(values) <= 6 else f"{values[:6]}... ({len(values)} values)"
