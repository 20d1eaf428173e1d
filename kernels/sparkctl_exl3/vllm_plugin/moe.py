"""EXL3 routed experts in vLLM's fused-MoE layer.

EXL3 stores every expert as separate linears (``experts.<e>.<proj>.trellis`` etc., SPEC 1.5), each with
its own K. vLLM's ``RoutedExperts.load_weights`` maps those names onto ``w13_<tensor>`` (gate = ``w1``,
up = ``w3``) and ``w2_<tensor>`` (down) and calls the parameter's loader with the global expert id (before vLLM
0.32 the plugin's own :func:`compat.load_named_experts` does, see there); our loaders keep per-expert tensors, cut
for tensor parallelism on 128 boundaries.

The forward is :func:`forward.exl3_moe_forward`: on the CPU only the routed experts, gathered by id from per-projection
stacks made once here; on CUDA the fused MoE decode for mul1 experts (its device tables made once here), every local
expert through the EXL3 op otherwise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.utils import set_weight_attrs

from . import compat, settings, storage
from .forward import (
    ACTIVATIONS,
    Exl3LoadError,
    ExpertStack,
    ExpertWeights,
    ShardWeights,
    StackedProjection,
    exl3_moe_forward,
    finish_shard,
    fused_tables,
    prefill_tables,
    stack_experts,
)
from .linear import LOADED_TENSORS, cut_for_rank

__all__ = ["EXL3MoEMethod", "ExpertWeights", "exl3_moe_forward"]

logger = logging.getLogger("sparkctl_exl3.vllm_plugin")

#: vLLM's shard ids for an expert's projections and the checkpoint names they usually come from
PROJ_NAMES = {"w1": "gate_proj (w1)", "w3": "up_proj (w3)", "w2": "down_proj (w2)"}


@dataclass
class ExpertsPlan:
    prefix: str
    local_experts: int
    hidden: int
    intermediate: int  # per tensor-parallel partition
    tp_rank: int
    tp_size: int
    gated: bool
    activation: str
    loaded: dict[tuple[int, str], dict[str, torch.Tensor]] = field(default_factory=dict)
    global_ids: dict[int, int] = field(default_factory=dict)  # local -> global expert id


class EXL3MoEMethod(FusedMoEMethodBase):
    """Routed experts stored as EXL3: per-expert tensors, forward through :func:`exl3_moe_forward`."""

    def __init__(self, quant_config: Any, moe: Any, prefix: str):
        super().__init__(moe)
        self.quant_config = quant_config
        self.prefix = prefix

    def create_weights(
        self,
        layer: torch.nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        moe = layer.moe_config
        activation = moe.activation.value.removesuffix("_no_mul")
        if activation not in ACTIVATIONS:
            raise Exl3LoadError(
                f"{self.prefix}: MoE activation {moe.activation.value!r} is not supported by the EXL3 plugin "
                f"(supported: {', '.join(ACTIVATIONS)})"
            )
        plan = ExpertsPlan(
            prefix=self.prefix,
            local_experts=num_experts,
            hidden=hidden_size,
            intermediate=intermediate_size_per_partition,
            tp_rank=int(moe.tp_rank),
            tp_size=int(moe.tp_size),
            gated=bool(moe.is_act_and_mul),
            activation=activation,
        )
        if plan.tp_size > 1:
            storage.column_cut(
                f"{self.prefix} (expert intermediate)",
                (plan.tp_rank + 1) * plan.intermediate,
                plan.intermediate,
                plan.tp_rank,
                plan.tp_size,
            )
        layer.exl3_plan = plan
        compat.use_named_expert_loading(layer)
        for group in ("w13", "w2"):
            for name, dtype in LOADED_TENSORS.items():
                param = Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
                layer.register_parameter(f"{group}_{name}", param)
                set_weight_attrs(param, {"weight_loader": partial(self._load, layer, name)})

    def _load(
        self,
        layer: torch.nn.Module,
        name: str,
        param: Parameter,
        loaded_weight: torch.Tensor,
        weight_name: str = "",
        shard_id: str = "",
        expert_id: int = -1,
        return_success: bool = False,
    ) -> bool | None:
        """Loader for one tensor of one expert projection; returns False for experts other ranks hold."""
        plan: ExpertsPlan = layer.exl3_plan
        local = int(layer._map_global_expert_id_to_local_expert_id(expert_id))
        if local < 0:
            return False if return_success else None
        if shard_id not in PROJ_NAMES:
            raise Exl3LoadError(f"{plan.prefix}: unexpected expert shard id {shard_id!r} for {weight_name}")
        label = f"{plan.prefix}.{expert_id}.{PROJ_NAMES[shard_id]}"
        t = cut_for_rank(
            label,
            name,
            loaded_weight,
            split="row"
            if shard_id == "w2"
            else "column",  # down splits its input (intermediate), gate/up their output
            part=plan.intermediate,
            rank=plan.tp_rank,
            tp_size=plan.tp_size,
        )
        plan.loaded.setdefault((local, shard_id), {})[name] = t.to(device=param.device).contiguous()
        plan.global_ids[local] = int(expert_id)
        return True if return_success else None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        plan: ExpertsPlan = layer.exl3_plan
        experts: list[ExpertWeights] = []
        for local in range(plan.local_experts):
            gid = plan.global_ids.get(local, local)
            proj = {}
            for shard in ("w1", "w3", "w2") if plan.gated else ("w1", "w2"):
                label = f"{plan.prefix}.{gid}.{PROJ_NAMES[shard]}"
                proj[shard] = finish_shard(label, plan.loaded.get((local, shard), {}))
            experts.append(ExpertWeights(proj["w1"], proj.get("w3"), proj["w2"]))
            if settings.load().log_layers:
                logger.info(
                    "exl3 %s expert %d: K=%s codebooks=%s",
                    plan.prefix,
                    gid,
                    [proj[s].bits for s in proj],
                    [proj[s].codebook for s in proj],
                )
        for group in ("w13", "w2"):
            for name in LOADED_TENSORS:
                delattr(layer, f"{group}_{name}")
        # Keep the tensors as (non-persistent) buffers so they move with the module and torch.compile sees them.
        for local, expert in enumerate(experts):
            for tag, w in (("gate", expert.gate), ("up", expert.up), ("down", expert.down)):
                if w is None:
                    continue
                for name in ("trellis", "suh", "svh"):
                    layer.register_buffer(f"exl3_e{local}_{tag}_{name}", getattr(w, name), persistent=False)
        layer.exl3_expert_meta = [
            {tag: (w.codebook, w.bits) for tag, w in (("gate", e.gate), ("up", e.up), ("down", e.down)) if w}
            for e in experts
        ]
        layer.exl3_expert_ids = [plan.global_ids.get(i, i) for i in range(plan.local_experts)]
        # CUDA: the fused MoE decode's device tables (pointers into the buffers above), None where it does not apply
        layer.exl3_fused = fused_tables(
            experts, layer.exl3_expert_ids, hidden=plan.hidden, intermediate=plan.intermediate
        )
        # CUDA: the MoE prefill's checked expert lists and id lookup (None elsewhere), made here, not per call: the
        # prefill runs eager, and per-call Python over 128 experts left the GPU idle (kernels/PERF.md, "Model speed")
        layer.exl3_prefill = (
            prefill_tables(experts, layer.exl3_expert_ids)
            if experts and experts[0].gate.trellis.is_cuda
            else None
        )
        # The CPU path gathers routed experts from per-projection stacks (a copy of the experts' tensors, made
        # once: on the CPU the decode, not memory, is what costs).
        layer.exl3_stack_meta = None
        if experts and not experts[0].gate.trellis.is_cuda:
            stack = stack_experts(experts)
            meta = {}
            for tag in ("gate", "up", "down"):
                proj = getattr(stack, tag)
                if proj is None:
                    continue
                for name in ("trellis", "suh", "svh"):
                    layer.register_buffer(f"exl3_stack_{tag}_{name}", getattr(proj, name), persistent=False)
                meta[tag] = (proj.k2, proj.codebook_ids)
            layer.exl3_stack_meta = meta
        plan.loaded.clear()

    def expert_weights(self, layer: torch.nn.Module) -> list[ExpertWeights]:
        """The loaded experts of ``layer``, read from its buffers (for the forward, tests and the GPU check); kept
        on the layer until its buffers are replaced (a move to another device), since the forward asks every call."""
        anchor = layer._buffers.get("exl3_e0_gate_trellis")
        kept = getattr(layer, "_exl3_experts_kept", None)
        if kept is not None and kept[0] is anchor:
            return kept[1]
        experts = self._read_experts(layer)
        layer._exl3_experts_kept = (anchor, experts)
        return experts

    def _read_experts(self, layer: torch.nn.Module) -> list[ExpertWeights]:
        experts = []
        for local, meta in enumerate(layer.exl3_expert_meta):

            def shard(tag: str, local: int = local, meta: dict = meta) -> ShardWeights | None:
                if tag not in meta:
                    return None
                cb, bits = meta[tag]
                return ShardWeights(
                    getattr(layer, f"exl3_e{local}_{tag}_trellis"),
                    getattr(layer, f"exl3_e{local}_{tag}_suh"),
                    getattr(layer, f"exl3_e{local}_{tag}_svh"),
                    cb,
                    bits,
                )

            gate, down = shard("gate"), shard("down")
            assert gate is not None and down is not None
            experts.append(ExpertWeights(gate, shard("up"), down))
        return experts

    def expert_stack(self, layer: torch.nn.Module) -> ExpertStack | None:
        """The stacked experts of a CPU layer, read from its buffers (None on CUDA)."""
        meta = getattr(layer, "exl3_stack_meta", None)
        if meta is None:
            return None

        def proj(tag: str) -> StackedProjection | None:
            if tag not in meta:
                return None
            k2, cbs = meta[tag]
            t = [getattr(layer, f"exl3_stack_{tag}_{name}") for name in ("trellis", "suh", "svh")]
            return StackedProjection(*t, k2, cbs)

        gate, down = proj("gate"), proj("down")
        assert gate is not None and down is not None
        return ExpertStack(gate, proj("up"), down)

    def get_fused_moe_quant_config(self, layer: torch.nn.Module) -> None:
        # Self-contained method: no vLLM modular kernel, so no FusedMoEQuantConfig (as GGUF does).
        return None

    def apply(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_experts: Any = None,
        shared_experts_input: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # Shared experts (if any) are run by vLLM's MoE runner when the method has no modular kernel.
        plan: ExpertsPlan = layer.exl3_plan
        return exl3_moe_forward(
            x,
            topk_weights,
            topk_ids,
            self.expert_weights(layer),
            layer.exl3_expert_ids,
            hidden=x.shape[-1],
            intermediate=plan.intermediate,
            activation=plan.activation,
            apply_router_weight_on_input=bool(getattr(layer, "apply_router_weight_on_input", False)),
            stack=None if x.is_cuda else self.expert_stack(layer),
            fused=getattr(layer, "exl3_fused", None),
            prefill=getattr(layer, "exl3_prefill", None),
        )
