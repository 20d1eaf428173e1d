"""The forward math of the plugin's EXL3 layers, free of vLLM.

Everything a loaded EXL3 layer computes lives here (torch and ``sparkctl_exl3.ops`` only), and the vLLM
methods in ``linear.py`` / ``moe.py`` only adapt vLLM's layer objects to it. That keeps the GPU check
(``kernels/bench/plugin_gpu_check.py``) honest on a device machine where vLLM is not installed: it runs
the very functions the plugin's ``apply`` methods call, on CUDA and on the CPU.

The MoE forward is one function, :func:`exl3_moe_forward`, so a fused EXL3 MoE kernel can replace it
later without touching the rest. Until then it runs every local expert on every token through the EXL3
GEMM op and weights the result by that token's routing weight for the expert (zero when not routed).
That costs ``local experts / top_k`` times the minimal work, but it has no host synchronisation and no
Python branch on routing values: the routing tensors are only multiplied and compared, never read back,
so it is safe under CUDA graphs and torch.compile and gives exactly the top-k weighted sum vLLM expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from .. import ops, reference
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
) -> torch.Tensor:
    """Top-k weighted sum of the routed experts' outputs for x [tokens, hidden] -> [tokens, hidden].

    ``topk_ids`` holds global expert ids; ``expert_ids[i]`` is the global id of ``experts[i]``. The loop is over
    the experts this rank holds (a fixed Python list), never over routing values.
    """
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
