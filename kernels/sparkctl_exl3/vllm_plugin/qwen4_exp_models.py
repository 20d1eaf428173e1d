"""vLLM's own Qwen4Exp model classes, built through :func:`.qwen4_exp.exl3_construction` (registered by ``register()``
for the architecture names ``Qwen4ExpForConditionalGeneration``, ``Qwen4ExpForCausalLM`` and ``Qwen4ExpMTP``).

Each class is a subclass of the one vLLM picks for the platform (``vllm.models.qwen4_exp``): same forward, same
weights mapping; only the constructor runs inside the hook, and loading drops the vision tower's split q/k/v in
favour of the fused copy and checks the packed PLE tables' hashing. With any quantization but EXL3 the classes
behave exactly as vLLM's.

Importing this module imports vLLM's Qwen4Exp, whose vision tower needs torchvision.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import torch
import vllm.models.qwen4_exp as _qwen4_exp

from .qwen4_exp import check_ngram_tables, draft_quant_config, exl3_construction, skip_split_vision_qkv

__all__ = ["Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration", "Qwen4ExpMTP"]


def _subclass(name: str, *, draft: bool = False) -> type:
    base = getattr(_qwen4_exp, name)
    module = sys.modules[base.__module__]

    def __init__(self: Any, *, vllm_config: Any, **kwargs: Any) -> None:
        quant = draft_quant_config(vllm_config) if draft else vllm_config.quant_config
        with exl3_construction(quant, module):
            base.__init__(self, vllm_config=vllm_config, **kwargs)
        self._exl3_quant = quant

    def load_weights(self: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = base.load_weights(self, skip_split_vision_qkv(weights, self._exl3_quant))
        check_ngram_tables(self)
        return loaded

    return type(
        name,
        (base,),
        {"__init__": __init__, "load_weights": load_weights, "__module__": __name__, "__qualname__": name},
    )


Qwen4ExpForConditionalGeneration = _subclass("Qwen4ExpForConditionalGeneration")
Qwen4ExpForCausalLM = _subclass("Qwen4ExpForCausalLM")
Qwen4ExpMTP = _subclass("Qwen4ExpMTP", draft=True)
