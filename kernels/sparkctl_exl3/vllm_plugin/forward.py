"""The forward math of the plugin's EXL3 layers, free of vLLM.

Everything a loaded EXL3 layer computes lives here (torch and ``sparkctl_exl3.ops`` only), and the vLLM
methods in ``linear.py`` / ``moe.py`` only adapt vLLM's layer objects to it. That keeps the GPU check
(``kernels/bench/plugin_gpu_check.py``) honest on a device machine where vLLM is not installed: it runs
the very functions the plugin's ``apply`` methods call, on CUDA and on the CPU.

The MoE forward is one function, :func:`exl3_moe_forward`, so a fused EXL3 MoE kernel can replace it
without touching the rest. No decode path reads routing values on the host or branches on them (the routing
tensors are only indexed, multiplied and compared), so they are safe under CUDA graphs and torch.compile; the
CUDA prefill path reads the per-expert counts once and is never taken during a graph capture:

* CPU (the reference decoder): only the routed experts are computed. The layer's experts are stacked per
  projection (:func:`stack_experts`, once at load time), every (token, slot) pair gathers its expert by id
  (``ops.exl3_gemm_gathered``) and the weighted results are scattered back onto their tokens (``index_add_``):
  top_k decodes per token instead of one per local expert.
* CUDA, mul1 experts (every exllamav3 model since 1.0), up to :data:`FUSED_MAX_TOKENS` tokens: the fused MoE decode
  (``sparkctl_exl3.cuda.moe``): only the routed experts, found on the device from the routing ids, in three launches.
* CUDA, prefill-sized calls (more tokens than the fused decode takes, or more than :data:`PREFILL_MIN_TOKENS`
  without it), outside CUDA-graph capture: ``sparkctl_exl3.cuda.moe_prefill``, only the routed experts,
  reconstructed to fp16 and run as batched GEMMs after one host sync for the per-expert counts (prefill runs eager).
* CUDA otherwise (decode without the fused kernel, a graph capture, router weight on the input): every local expert
  runs on every token through the EXL3 op and is weighted by that token's routing weight for it (zero when not
  routed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from .. import ops, paths, reference
from . import settings, storage


class Exl3LoadError(ValueError):
    """A checkpoint that says exl3 but whose tensors cannot make a working EXL3 layer."""


@dataclass
class ShardWeights:
    """One logical linear (a shard of a fused layer) after loading: what the op needs."""

    trellis: torch.Tensor
    suh: torch.Tensor
    svh: torch.Tensor
    codebook: str
    bits: float


def op_dtype_for(x: torch.Tensor) -> torch.dtype:
    """The activation dtype handed to the op (``VLLM_EXL3_OP_DTYPE``)."""
    mode = settings.load().op_dtype
    if mode == "float16" or (mode == "auto" and x.is_cuda):
        return torch.float16
    return x.dtype


def exl3_linear(x: torch.Tensor, w: ShardWeights, out_features: int, op_dtype: torch.dtype) -> torch.Tensor:
    """``x . W`` for one shard: zero-extend x to the stored (128-padded) input width, then cut or zero-pad the
    output to the width vLLM expects. Both are shape-static, so nothing here depends on tensor values."""
    stored_in = w.suh.shape[0]
    if x.shape[-1] < stored_in:
        x = F.pad(x, (0, stored_in - x.shape[-1]))
    y = ops.exl3_matmul(x.to(op_dtype), w.trellis, w.suh, w.svh, w.codebook)
    stored_out = y.shape[-1]
    if stored_out > out_features:
        y = y[..., :out_features]
    elif stored_out < out_features:
        y = F.pad(y, (0, out_features - stored_out))
    return y


def finish_shard(name: str, got: dict[str, torch.Tensor]) -> ShardWeights:
    """Validate the tensors loaded for one logical linear and decide its codebook and K.

    Errors name the checkpoint module, so a user can find it in the safetensors index.
    """
    missing = [n for n in storage.EXL3_TENSORS if n not in got]
    if missing:
        present = ", ".join(f"{name}.{n}" for n in sorted(got)) or "none"
        raise Exl3LoadError(
            f"{name}: config.json declares quant_method exl3 but the checkpoint lacks "
            f"{', '.join(f'{name}.{n}' for n in missing)} (found: {present}); an EXL3 layer stores "
            f"trellis, suh and svh. Is this checkpoint really EXL3, and complete?"
        )
    markers = {n: got[n] for n in storage.MARKER_TENSORS if n in got}
    try:
        codebook = reference.codebook_of({f"{name}.{n}": t.cpu() for n, t in markers.items()})
        bits = reference.check_layer(got["trellis"], got["suh"], got["svh"], codebook)
    except (ValueError, TypeError) as exc:
        raise Exl3LoadError(f"{name}: {exc}") from None
    return ShardWeights(got["trellis"], got["suh"], got["svh"], codebook, bits)


ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
}


@dataclass(frozen=True)
class ExpertWeights:
    """One expert's three projections (``up`` is None for non-gated activations)."""

    gate: ShardWeights
    up: ShardWeights | None
    down: ShardWeights


@dataclass(frozen=True)
class StackedProjection:
    """One projection of every local expert, stacked for gathering by expert index (``ops.exl3_gemm_gathered``)."""

    trellis: torch.Tensor  # int16 [E, I/16, O/16, Lmax], zero-padded past each expert's 16*K
    suh: torch.Tensor  # [E, I]
    svh: torch.Tensor  # [E, O]
    k2: tuple[int, ...]  # twice each expert's bits
    codebook_ids: tuple[int, ...]


@dataclass(frozen=True)
class ExpertStack:
    gate: StackedProjection
    up: StackedProjection | None
    down: StackedProjection


def _stack(label: str, shards: Sequence[ShardWeights]) -> StackedProjection:
    shapes = {tuple(w.trellis.shape[:2]) for w in shards}
    if len(shapes) != 1:
        raise Exl3LoadError(
            f"{label}: the experts' stored shapes differ ({sorted(shapes)}); cannot stack them"
        )
    longest = max(int(w.trellis.shape[-1]) for w in shards)
    trellis = torch.stack([F.pad(w.trellis, (0, longest - int(w.trellis.shape[-1]))) for w in shards])
    return StackedProjection(
        trellis,
        torch.stack([w.suh for w in shards]),
        torch.stack([w.svh for w in shards]),
        tuple(int(round(2 * w.bits)) for w in shards),
        tuple(ops.CODEBOOKS[w.codebook] for w in shards),
    )


def stack_experts(experts: Sequence[ExpertWeights]) -> ExpertStack:
    """The experts' tensors stacked per projection (a copy), for the CPU path of :func:`exl3_moe_forward`."""
    ups = [e.up for e in experts]
    if any(u is None for u in ups) and not all(u is None for u in ups):
        raise Exl3LoadError("some experts have an up projection and others do not")
    return ExpertStack(
        _stack("gate", [e.gate for e in experts]),
        None if ups[0] is None else _stack("up", ups),  # type: ignore[arg-type]
        _stack("down", [e.down for e in experts]),
    )


def _gathered_linear(
    x: torch.Tensor, w: StackedProjection, index: torch.Tensor, out_features: int, op_dtype: torch.dtype
) -> torch.Tensor:
    """Row p of x through expert ``index[p]``, padded and cut like :func:`exl3_linear`."""
    stored_in = w.suh.shape[-1]
    if x.shape[-1] < stored_in:
        x = F.pad(x, (0, stored_in - x.shape[-1]))
    y = torch.ops.sparkctl_exl3.exl3_gemm_gathered(
        x.to(op_dtype), w.trellis, w.suh, w.svh, list(w.k2), list(w.codebook_ids), index
    )
    stored_out = y.shape[-1]
    if stored_out > out_features:
        y = y[..., :out_features]
    elif stored_out < out_features:
        y = F.pad(y, (0, out_features - stored_out))
    return y


def _moe_routed(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    stack: ExpertStack,
    expert_ids: Sequence[int],
    *,
    hidden: int,
    intermediate: int,
    activation: str,
    apply_router_weight_on_input: bool,
) -> torch.Tensor:
    """Only the routed experts: one gathered decode per (token, slot) pair, scattered back onto its token."""
    act = ACTIVATIONS[activation]
    dtype = op_dtype_for(x)
    tokens, top_k = topk_ids.shape
    # global expert id -> local index, -1 for ids this rank does not hold (expert parallel) or out of range
    top = max(expert_ids) + 1
    lookup = torch.full((top + 1,), -1, dtype=torch.int64, device=x.device)
    lookup[torch.tensor(list(expert_ids), dtype=torch.int64, device=x.device)] = torch.arange(
        len(expert_ids), device=x.device
    )
    ids = topk_ids.reshape(-1).to(torch.int64)
    local = lookup[torch.where((ids >= 0) & (ids < top), ids, top)]
    held = local >= 0
    index = local.clamp_min(0)  # a pair routed off this rank computes local expert 0 and is dropped below
    token = torch.arange(tokens, device=x.device)[:, None].expand(tokens, top_k).reshape(-1)
    weight = (topk_weights.reshape(-1).to(torch.float32) * held)[:, None]
    xe = x.index_select(0, token)
    if apply_router_weight_on_input:
        xe = xe * weight.to(x.dtype)
    h = act(_gathered_linear(xe, stack.gate, index, intermediate, dtype).float())
    if stack.up is not None:
        h = h * _gathered_linear(xe, stack.up, index, intermediate, dtype).float()
    y = _gathered_linear(h.to(dtype), stack.down, index, hidden, dtype).float()
    y = torch.where(held[:, None], y if apply_router_weight_on_input else y * weight, 0.0)
    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=x.device).index_add_(0, token, y)
    return out.to(x.dtype)


#: Most tokens the fused MoE decode takes per call (its grid holds tokens * top_k * 2 GEMVs); prefill-sized batches
#: take the per-expert path.
FUSED_MAX_TOKENS = 64


#: Fewer tokens than this never take the MoE prefill (``cuda.moe_prefill``): the per-expert GEMV path is graph-safe.
PREFILL_MIN_TOKENS = 8


@dataclass(frozen=True)
class PrefillTables:
    """What :func:`_moe_prefill` needs besides the call's tensors, made once per CUDA layer (:func:`prefill_tables`):
    the experts as ``cuda.moe_prefill`` reads them and the global-id lookup of this rank."""

    table: object  # sparkctl_exl3.cuda.MoePrefillTable
    #: global expert id -> index into the layer's experts, -1 for other ranks' ids; ``top`` (ids past the table) -> -1
    lookup: torch.Tensor
    top: int
    stored_in: int


def prefill_tables(experts: Sequence[ExpertWeights], expert_ids: Sequence[int]) -> PrefillTables | None:
    """The layer's :class:`PrefillTables`, or None when the extension cannot take its experts (no CUDA kernels,
    an older build): the per-expert loop runs instead."""
    if not experts:
        return None
    try:
        from .. import cuda
    except ImportError:
        return None
    if not cuda.available() or not hasattr(cuda, "moe_prefill_prepare"):
        return None
    table = cuda.moe_prefill_prepare(
        [
            {
                tag: (w.trellis, w.suh, w.svh, w.codebook)
                for tag, w in (("gate", e.gate), ("up", e.up), ("down", e.down))
                if w is not None
            }
            for e in experts
        ]
    )
    device = experts[0].gate.trellis.device
    top = max(expert_ids) + 1
    lookup = torch.full((top + 1,), -1, dtype=torch.int64, device=device)
    lookup[torch.tensor(list(expert_ids), dtype=torch.int64, device=device)] = torch.arange(
        len(expert_ids), device=device
    )
    return PrefillTables(table, lookup, top, int(experts[0].gate.suh.shape[-1]))


def _moe_prefill(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    experts: Sequence[ExpertWeights],
    expert_ids: Sequence[int],
    hidden: int,
    intermediate: int,
    activation: str,
    tables: PrefillTables | None = None,
) -> torch.Tensor | None:
    """Prefill-sized calls through ``cuda.moe_prefill`` (routed experts only, reconstructed and run as batched
    GEMMs; one host sync for the counts, so never while a CUDA graph is being captured), or None when the
    extension cannot take them (the per-expert loop runs instead). ``tables``: the layer's :func:`prefill_tables`
    (made here when not given)."""
    try:
        from .. import cuda
    except ImportError:
        return None
    if not cuda.available() or not hasattr(cuda, "moe_prefill") or activation not in cuda.PREFILL_ACTIVATIONS:
        return None
    if tables is None:
        tables = prefill_tables(experts, expert_ids)
        if tables is None:
            return None
    # other ranks' ids (and ids past the table) become -1: they add nothing
    ids = topk_ids.to(torch.int64)
    local = tables.lookup[torch.where((ids >= 0) & (ids < tables.top), ids, tables.top)]
    xs = x.to(torch.float16)
    if xs.shape[-1] < tables.stored_in:
        xs = F.pad(xs, (0, tables.stored_in - xs.shape[-1]))
    y = cuda.moe_prefill(xs, local, topk_weights, tables.table, activation, intermediate=intermediate)
    if y.shape[-1] > hidden:
        y = y[..., :hidden]
    return y.to(x.dtype)


def fused_tables(
    experts: Sequence[ExpertWeights], expert_ids: Sequence[int], *, hidden: int, intermediate: int
) -> object | None:
    """The fused MoE's device tables for a CUDA layer (``cuda.moe_prepare``), or None when the kernel does not take
    these experts (codebooks other than mul1, padded widths, no extension): the layer then runs per expert."""
    if not experts or not experts[0].gate.trellis.is_cuda:
        return None
    try:
        from .. import cuda
    except ImportError:
        return None
    table = [
        {
            tag: None if w is None else (w.trellis, w.suh, w.svh, w.codebook)
            for tag, w in (("gate", e.gate), ("up", e.up), ("down", e.down))
        }
        for e in experts
    ]
    if not cuda.moe_supports(table):
        return None
    tables = cuda.moe_prepare(table, list(expert_ids))
    if tables.hidden != hidden or tables.width != intermediate:
        return None  # stored widths padded past the layer's: the per-expert path cuts and pads them
    return tables


def exl3_moe_forward(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    experts: Sequence[ExpertWeights],
    expert_ids: Sequence[int],
    *,
    hidden: int,
    intermediate: int,
    activation: str,
    apply_router_weight_on_input: bool = False,
    stack: ExpertStack | None = None,
    fused: object | None = None,
    prefill: PrefillTables | None = None,
) -> torch.Tensor:
    """Top-k weighted sum of the routed experts' outputs for x [tokens, hidden] -> [tokens, hidden].

    ``topk_ids`` holds global expert ids; ``expert_ids[i]`` is the global id of ``experts[i]``. On the CPU only the
    routed experts are computed, from ``stack`` (``stack_experts(experts)``; made here when not given). On CUDA,
    ``fused`` (:func:`fused_tables`, made once at load time) takes decode-sized calls through the fused kernel,
    prefill-sized calls go through ``cuda.moe_prefill`` (one host sync, never during a graph capture; ``prefill``:
    the layer's :func:`prefill_tables`, made once); the other
    calls loop over the experts this rank holds (a fixed Python list), never over routing values.
    """
    if not x.is_cuda:
        paths.hit("moe-routed-cpu")
        return _moe_routed(
            x,
            topk_weights,
            topk_ids,
            stack if stack is not None else stack_experts(experts),
            expert_ids,
            hidden=hidden,
            intermediate=intermediate,
            activation=activation,
            apply_router_weight_on_input=apply_router_weight_on_input,
        )
    if fused is not None and not apply_router_weight_on_input and x.shape[0] <= FUSED_MAX_TOKENS:
        from .. import cuda

        paths.hit("moe-fused")
        out_dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32
        y = cuda.moe(x.to(torch.float16), topk_ids, topk_weights, fused, activation, out_dtype=out_dtype)  # type: ignore[arg-type]
        return y.to(x.dtype)
    prefill_from = FUSED_MAX_TOKENS if fused is not None else PREFILL_MIN_TOKENS
    if (
        not apply_router_weight_on_input
        and x.shape[0] > prefill_from
        and not torch.cuda.is_current_stream_capturing()
    ):
        y = _moe_prefill(
            x, topk_weights, topk_ids, experts, expert_ids, hidden, intermediate, activation, prefill
        )
        if y is not None:
            paths.hit("moe-prefill")
            return y
    paths.hit("moe-per-expert")
    act = ACTIVATIONS[activation]
    dtype = op_dtype_for(x)
    out = torch.zeros(x.shape[0], hidden, dtype=torch.float32, device=x.device)
    for expert, global_id in zip(experts, expert_ids, strict=True):
        # this expert's routing weight per token, 0 where it was not chosen
        weight = (topk_weights * (topk_ids == global_id)).sum(dim=-1, keepdim=True).to(torch.float32)
        xe = x * weight.to(x.dtype) if apply_router_weight_on_input else x
        h = act(exl3_linear(xe, expert.gate, intermediate, dtype).float())
        if expert.up is not None:
            h = h * exl3_linear(xe, expert.up, intermediate, dtype).float()
        y = exl3_linear(h.to(dtype), expert.down, hidden, dtype).float()
        out = out + (y if apply_router_weight_on_input else y * weight)
    return out.to(x.dtype)
