"""EXL3 linear layers in vLLM: per-shard weights, vLLM-driven loading, forward through our ops.

vLLM fuses q/k/v into one ``QKVParallelLinear`` and gate/up into one ``MergedColumnParallelLinear`` and
feeds the checkpoint's per-module tensors to them with a shard id. EXL3 cannot be fused like plain
weights: each shard has its own trellis with its own K (the tile length differs), its own codebook and
its own scales. So the layer keeps one set of tensors per shard, collected by our own weight loaders
(placeholder parameters named like the checkpoint tensors: ``trellis``, ``suh``, ``svh``, ``mcg``,
``mul1``), validated in ``process_weights_after_loading``, and applied as one op call per shard whose
outputs are concatenated.

Tensor parallelism cuts the stored tensors on 128-wide Hadamard blocks (``storage.column_cut`` /
``storage.row_cut``); any other cut raises with the layer's name.

The same method serves the quantized lm_head (a ``ParallelLMHead``, which vLLM treats as an embedding
with a linear-style ``apply``): vocab parallelism is a column split, and the EXL3 vocab padding (128)
is cut back to vLLM's padded width (64).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import LinearMethodBase, ReplicatedLinear, RowParallelLinear
from vllm.model_executor.utils import set_weight_attrs

from . import settings, storage
from .forward import Exl3LoadError, ShardWeights, exl3_linear, finish_shard, op_dtype_for

__all__ = [
    "LOADED_TENSORS",
    "EXL3LinearMethod",
    "Exl3LoadError",
    "ShardWeights",
    "cut_for_rank",
    "exl3_linear",
    "finish_shard",
]

logger = logging.getLogger("sparkctl_exl3.vllm_plugin")

#: Tensors a quantized linear stores (SPEC 1.1), with the dtype of their placeholder parameter.
LOADED_TENSORS: dict[str, torch.dtype] = {
    "trellis": torch.int16,
    "suh": torch.float16,
    "svh": torch.float16,
    "mcg": torch.int32,
    "mul1": torch.int32,
}

_QKV_INDEX = {"q": 0, "k": 1, "v": 2}


def cut_for_rank(
    label: str, name: str, t: torch.Tensor, *, split: str, part: int, rank: int, tp_size: int
) -> torch.Tensor:
    """This rank's part of one stored tensor of a layer split across ``tp_size`` ranks (``label.name``).

    ``split="row"`` cuts the input: the trellis along dim 0 (16 rows a tile) and suh, svh is replicated;
    ``split="column"`` cuts the output: the trellis along dim 1 (16 columns a tile) and svh, suh is
    replicated. The codebook markers are never cut. Shared by the linear and the MoE loaders.
    """
    if name == "trellis" and t.dim() != 3:
        raise Exl3LoadError(f"{label}.trellis: expected 3 dims [I/16, O/16, 16*K], got {tuple(t.shape)}")
    if tp_size == 1 or name not in ("trellis", "suh" if split == "row" else "svh"):
        return t
    if split == "row":
        stored = t.shape[0] * 16 if name == "trellis" else t.shape[0]
        start, width = storage.row_cut(label, stored, part, rank, tp_size)
        return t.narrow(0, start // 16, width // 16) if name == "trellis" else t.narrow(0, start, width)
    stored = t.shape[1] * 16 if name == "trellis" else t.shape[0]
    start, width = storage.column_cut(label, stored, part, rank, tp_size)
    return t.narrow(1, start // 16, width // 16) if name == "trellis" else t.narrow(0, start, width)


@dataclass
class LayerPlan:
    """How one vLLM layer maps onto EXL3 shards; set up in create_weights, filled by the loaders."""

    prefix: str
    shard_names: list[str]  # checkpoint module name of each shard, for error messages
    out_sizes: list[int]  # this rank's output width of each shard (vLLM's partition sizes)
    in_size: int  # this rank's input width
    mode: str  # "column" | "row" | "replicated" | "vocab"
    tp_rank: int
    tp_size: int
    kv_replicas: int = 1
    loaded: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    fused_on_disk: bool = False


def shard_names_for(prefix: str, packed: dict[str, list[str]], count: int) -> list[str]:
    """Checkpoint module names behind a vLLM layer prefix, e.g. ``...qkv_proj`` -> ``...q_proj``, ``...k_proj``."""
    parent, _, last = prefix.rpartition(".")
    names = packed.get(last)
    if names and len(names) == count:
        return [f"{parent}.{n}" if parent else n for n in names]
    return [prefix] if count == 1 else [f"{prefix}[{i}]" for i in range(count)]


class EXL3LinearMethod(LinearMethodBase):
    """Linear method for EXL3 checkpoints (dense linears, fused q/k/v and gate/up, the lm_head)."""

    def __init__(self, quant_config: Any, prefix: str, *, vocab: bool = False):
        self.quant_config = quant_config
        self.prefix = prefix
        self.vocab = vocab

    # -- weights ---------------------------------------------------------------------------------

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        tp_size = int(getattr(layer, "tp_size", 1))
        tp_rank = int(getattr(layer, "tp_rank", 0))
        if self.vocab:
            mode = "vocab"
        elif isinstance(layer, ReplicatedLinear) or getattr(layer, "disable_tp", False) or tp_size == 1:
            mode = "replicated"
        elif isinstance(layer, RowParallelLinear):
            mode = "row"
        else:
            mode = "column"
        packed = getattr(self.quant_config, "packed_modules_mapping", {}) or {}
        plan = LayerPlan(
            prefix=self.prefix,
            shard_names=shard_names_for(self.prefix, packed, len(output_partition_sizes)),
            out_sizes=list(output_partition_sizes),
            in_size=input_size_per_partition,
            mode=mode,
            tp_rank=tp_rank,
            tp_size=tp_size if mode != "replicated" else 1,
            kv_replicas=int(getattr(layer, "num_kv_head_replicas", 1)),
        )
        # Refuse a split that cannot work now, at model construction, rather than serve wrong numbers.
        if plan.tp_size > 1:
            if mode == "row":
                storage.row_cut(self.prefix, input_size, input_size_per_partition, tp_rank, tp_size)
            else:
                for i, part in enumerate(output_partition_sizes):
                    rank = self._shard_rank(plan, i)
                    storage.column_cut(plan.shard_names[i], rank * part + part, part, rank, tp_size)
        layer.exl3_plan = plan
        device = torch.get_default_device()
        for name, dtype in LOADED_TENSORS.items():
            param = Parameter(torch.empty(0, dtype=dtype, device=device), requires_grad=False)
            layer.register_parameter(name, param)
            set_weight_attrs(param, {"weight_loader": partial(self._load, layer, name)})

    @staticmethod
    def _shard_rank(plan: LayerPlan, index: int) -> int:
        # k/v heads are replicated when tp_size > num_kv_heads: ranks that share a kv head load the same cut
        if len(plan.out_sizes) == 3 and index > 0:
            return plan.tp_rank // plan.kv_replicas
        return plan.tp_rank

    def _shard_index(self, plan: LayerPlan, shard_id: Any) -> int:
        if shard_id is None:
            if len(plan.out_sizes) > 1:
                plan.fused_on_disk = True
            return 0
        if isinstance(shard_id, str):
            return _QKV_INDEX[shard_id]
        if isinstance(shard_id, int):
            return shard_id
        raise Exl3LoadError(f"{plan.prefix}: shard id {shard_id!r} is not supported for EXL3 layers")

    def _load(
        self,
        layer: torch.nn.Module,
        name: str,
        param: Parameter,
        loaded_weight: torch.Tensor,
        loaded_shard_id: Any = None,
    ) -> None:
        """Weight loader for one stored tensor of one shard: cut it for this rank and keep it for later."""
        plan: LayerPlan = layer.exl3_plan
        index = self._shard_index(plan, loaded_shard_id)
        if plan.fused_on_disk and plan.tp_size > 1:
            raise Exl3LoadError(
                f"{plan.prefix}: the checkpoint stores this fused layer as one EXL3 tensor; splitting it "
                "across tensor-parallel ranks is not supported"
            )
        label = plan.shard_names[index] if not plan.fused_on_disk else plan.prefix
        row = plan.mode == "row"
        t = cut_for_rank(
            label,
            name,
            loaded_weight,
            split="row" if row else "column",
            part=plan.in_size if row else plan.out_sizes[index],
            rank=plan.tp_rank if row else self._shard_rank(plan, index),
            tp_size=plan.tp_size,
        )
        plan.loaded.setdefault(index, {})[name] = t.to(device=param.device).contiguous()

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        plan: LayerPlan = layer.exl3_plan
        count = 1 if plan.fused_on_disk else len(plan.out_sizes)
        shards: list[ShardWeights] = []
        for i in range(count):
            label = plan.prefix if plan.fused_on_disk else plan.shard_names[i]
            shard = finish_shard(label, plan.loaded.get(i, {}))
            stored_in = shard.suh.shape[0]
            if stored_in < plan.in_size:
                raise Exl3LoadError(
                    f"{label}: stored input width {stored_in} is smaller than the layer's {plan.in_size}"
                )
            shards.append(shard)
            if settings.load().log_layers:
                logger.info(
                    "exl3 %s: K=%g codebook=%s trellis=%s",
                    label,
                    shard.bits,
                    shard.codebook,
                    tuple(shard.trellis.shape),
                )
        # Replace the placeholders by the real per-shard tensors, as buffers the forward reads.
        for name in LOADED_TENSORS:
            delattr(layer, name)
        for i, shard in enumerate(shards):
            layer.register_buffer(f"exl3_trellis_{i}", shard.trellis, persistent=False)
            layer.register_buffer(f"exl3_suh_{i}", shard.suh, persistent=False)
            layer.register_buffer(f"exl3_svh_{i}", shard.svh, persistent=False)
        layer.exl3_codebooks = [s.codebook for s in shards]
        layer.exl3_bits = [s.bits for s in shards]
        layer.exl3_out = [sum(plan.out_sizes)] if plan.fused_on_disk else list(plan.out_sizes)
        plan.loaded.clear()

    # -- forward ---------------------------------------------------------------------------------

    def shard_weights(self, layer: torch.nn.Module) -> list[ShardWeights]:
        """The loaded shards of ``layer`` (for tests and the GPU check)."""
        return [
            ShardWeights(
                getattr(layer, f"exl3_trellis_{i}"),
                getattr(layer, f"exl3_suh_{i}"),
                getattr(layer, f"exl3_svh_{i}"),
                cb,
                bits,
            )
            for i, (cb, bits) in enumerate(zip(layer.exl3_codebooks, layer.exl3_bits, strict=True))
        ]

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        dtype = op_dtype_for(x)
        outs = [
            exl3_linear(x, w, out, dtype)
            for w, out in zip(self.shard_weights(layer), layer.exl3_out, strict=True)
        ]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        y = y.to(x.dtype)
        if bias is not None:
            y = y + bias
        return y
