"""Where the vLLM releases the plugin runs on differ, in one place.

The plugin runs on vLLM 0.26 (the last release on the lent H100's torch 2.11: the GPU engine check), 0.32 (the CPU
build the tests use), 0.33 (the Spark's image) and 0.34. Everything else in ``vllm_plugin`` is written against the
interface these releases share; ``RELIES_ON`` names that interface, and ``tests/plugin/test_vllm_seam.py`` checks it
against the installed vLLM and against the Python sources of the other releases' wheels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import MethodType
from typing import Any

import torch
import vllm
from packaging.version import Version

#: (module, class, method, parameters the plugin passes or overrides, in order). Same in 0.26, 0.32, 0.33, 0.34.
RELIES_ON: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "vllm.model_executor.layers.fused_moe.fused_moe_method_base",
        "FusedMoEMethodBase",
        "create_weights",
        ("self", "layer", "num_experts", "hidden_size", "intermediate_size_per_partition", "params_dtype"),
    ),
    (
        "vllm.model_executor.layers.fused_moe.fused_moe_method_base",
        "FusedMoEMethodBase",
        "apply",
        ("self", "layer", "x", "topk_weights", "topk_ids", "shared_experts", "shared_experts_input"),
    ),
    (
        "vllm.model_executor.layers.fused_moe.fused_moe_method_base",
        "FusedMoEMethodBase",
        "__init__",
        ("self", "moe"),
    ),
    (
        "vllm.model_executor.layers.linear",
        "LinearMethodBase",
        "create_weights",
        (
            "self",
            "layer",
            "input_size_per_partition",
            "output_partition_sizes",
            "input_size",
            "output_size",
            "params_dtype",
        ),
    ),
    ("vllm.model_executor.layers.linear", "LinearMethodBase", "apply", ("self", "layer", "x", "bias")),
    (
        "vllm.model_executor.layers.quantization.base_config",
        "QuantizationConfig",
        "get_quant_method",
        ("self", "layer", "prefix"),
    ),
    (
        "vllm.model_executor.layers.quantization.base_config",
        "QuantizationConfig",
        "maybe_update_config",
        ("self", "model_name", "hf_config", "revision"),
    ),
    (
        "vllm.model_executor.layers.quantization.base_config",
        "QuantizationConfig",
        "apply_vllm_mapper",
        ("self", "hf_to_vllm_mapper"),
    ),
    (
        "vllm.model_executor.layers.fused_moe.routed_experts",
        "RoutedExperts",
        "weight_loader",
        ("self", "param", "loaded_weight", "weight_name", "shard_id", "expert_id", "return_success"),
    ),
    (
        "vllm.model_executor.layers.fused_moe.routed_experts",
        "RoutedExperts",
        "_map_global_expert_id_to_local_expert_id",
        ("self", "expert_id"),
    ),
    (
        "vllm.model_executor.layers.fused_moe.routed_experts",
        "RoutedExperts",
        "get_expert_mapping",
        ("self", "ckpt_gate_proj_name", "ckpt_down_proj_name", "ckpt_up_proj_name", "include_fused"),
    ),
    (
        "vllm.model_executor.layers.fused_moe.routed_experts",
        "RoutedExperts",
        "load_weights",
        ("self", "weights"),
    ),
)

#: The installed release, (major, minor).
VLLM_RELEASE: tuple[int, ...] = Version(vllm.__version__).release[:2]


#: Before 0.32, ``RoutedExperts.load_weights`` takes every 3-D checkpoint tensor for a fused all-experts tensor
#: (``is_fused = loaded_weight.dim() == 3``) and unbinds it along its first axis. An EXL3 expert's trellis is 3-D
#: *per expert* ([in/16, out/16, 16*K]), so on 0.26 every MoE pack failed to load (GPU engine check, run 3). 0.32
#: asks the name first: ``experts.<e>.`` is one expert whatever its rank.
def expert_3d_read_as_fused(release: tuple[int, ...]) -> bool:
    return tuple(release[:2]) < (0, 32)


EXPERT_3D_READ_AS_FUSED: bool = expert_3d_read_as_fused(VLLM_RELEASE)


def load_named_experts(layer: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[str]:
    """``RoutedExperts.load_weights`` for per-expert checkpoint names (``experts.<e>.<proj>.<tensor>``): each tensor
    goes whole to the parameter's loader with the expert id its name gives, whatever its rank. An EXL3 pack has
    only such names (SPEC 1.5); a name no expert mapping matches is left unloaded, as vLLM leaves it."""
    prefix = f"{layer.layer_name}."
    mapping = layer.get_expert_mapping()
    for name, tensor in weights:
        qual = prefix + name
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name not in qual:
                continue
            target = qual.replace(weight_name, param_name).removeprefix(prefix)
            param = getattr(layer, target)
            if param.weight_loader(
                param=param,
                loaded_weight=tensor,
                weight_name=prefix + target,
                shard_id=shard_id,
                expert_id=expert_id,
                return_success=True,
            ):
                yield target


def use_named_expert_loading(layer: torch.nn.Module, *, always: bool = False) -> None:
    """Give an EXL3 experts layer :func:`load_named_experts` where the installed vLLM would misread its tensors.

    Set on the instance: vLLM reaches it as ``routed_experts.load_weights(...)`` (MoE runner) or through
    ``AutoWeightsLoader``'s ``getattr(module, "load_weights")``, and other layers keep vLLM's own loader.
    ``always`` lets a test run it on a release that does not need it."""
    if EXPERT_3D_READ_AS_FUSED or always:
        layer.load_weights = MethodType(load_named_experts, layer)  # type: ignore[method-assign]
