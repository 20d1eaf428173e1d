"""The vLLM ``exl3`` plugin: serve EXL3 checkpoints with vLLM, through sparkctl's EXL3 ops.

vLLM calls :func:`register` (entry point ``vllm.general_plugins: exl3``) in every process it starts:
API server, engine core, each worker, Ray workers. Registration must therefore be idempotent and
cheap, and this package's import must stay light: an ImportError while vLLM resolves the entry point
is only logged, and would surface much later as "Unknown quantization method: exl3". So nothing here
imports vLLM or torch until ``register()`` runs.

What ``register()`` does:

- registers the quantization config ``exl3`` (``EXL3Config``), so ``--quantization exl3`` and
  checkpoints whose config.json says ``quant_method: exl3`` load with our linear and MoE methods;
- imports ``sparkctl_exl3.ops``, which defines the ``torch.ops.sparkctl_exl3.*`` custom ops (with fake
  implementations), so torch.compile and CUDA graphs capture EXL3 layers as opaque ops, and
  ``sparkctl_exl3.ngram_cuda`` (the n-gram lookup op and its CUDA kernel);
- registers vLLM's Qwen4Exp architectures (``Qwen4ExpForConditionalGeneration``, ``Qwen4ExpForCausalLM``,
  ``Qwen4ExpMTP``) as subclasses that give an EXL3 config to the lm_heads and the packed n-gram (PLE) table,
  where vLLM's constructor passes none (``qwen4_exp.py``); lazily, by name, so nothing is imported until a
  Qwen4Exp model is loaded.

Settings: ``VLLM_EXL3_*`` environment variables (``settings.SETTINGS``).
"""

from __future__ import annotations

import threading

__all__ = ["register", "is_registered"]

_LOCK = threading.Lock()
#: vLLM architectures the plugin registers its own classes for (vllm_plugin/qwen4_exp_models.py).
QWEN4_EXP_ARCHS = ("Qwen4ExpForConditionalGeneration", "Qwen4ExpForCausalLM", "Qwen4ExpMTP")
_REGISTERED = False


def register() -> None:
    """Register the ``exl3`` quantization method with vLLM (idempotent; safe to call from any process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    with _LOCK:
        if _REGISTERED:
            return
        from vllm import ModelRegistry
        from vllm.model_executor.layers.quantization import (
            QUANTIZATION_METHODS,
            get_quantization_config,
            register_quantization_config,
        )

        from .. import ngram_cuda, ops  # noqa: F401  (define the torch.ops.sparkctl_exl3 custom ops)
        from . import settings
        from .config import EXL3Config

        settings.load()  # a bad VLLM_EXL3_* value fails here, at startup, with the variable named
        already = "exl3" in QUANTIZATION_METHODS and get_quantization_config("exl3") is EXL3Config
        if not already:
            register_quantization_config("exl3")(EXL3Config)
        for arch in QWEN4_EXP_ARCHS:
            ModelRegistry.register_model(arch, f"sparkctl_exl3.vllm_plugin.qwen4_exp_models:{arch}")
        _REGISTERED = True


def is_registered() -> bool:
    """Whether :func:`register` has completed in this process."""
    return _REGISTERED
