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
  implementations), so torch.compile and CUDA graphs capture EXL3 layers as opaque ops.

Settings: ``VLLM_EXL3_*`` environment variables (``settings.SETTINGS``).
"""

from __future__ import annotations

import threading

__all__ = ["register", "is_registered"]

_LOCK = threading.Lock()
_REGISTERED = False


def register() -> None:
    """Register the ``exl3`` quantization method with vLLM (idempotent; safe to call from any process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    with _LOCK:
        if _REGISTERED:
            return
        from vllm.model_executor.layers.quantization import (
            QUANTIZATION_METHODS,
            get_quantization_config,
            register_quantization_config,
        )

        from .. import ops  # noqa: F401  (defines the torch.ops.sparkctl_exl3 custom ops)
        from . import settings
        from .config import EXL3Config

        settings.load()  # a bad VLLM_EXL3_* value fails here, at startup, with the variable named
        already = "exl3" in QUANTIZATION_METHODS and get_quantization_config("exl3") is EXL3Config
        if not already:
            register_quantization_config("exl3")(EXL3Config)
        _REGISTERED = True


def is_registered() -> bool:
    """Whether :func:`register` has completed in this process."""
    return _REGISTERED
