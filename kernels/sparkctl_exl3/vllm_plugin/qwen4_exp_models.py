"""vLLM's own Qwen4Exp model classes, built through :func:`.qwen4_exp.exl3_construction` (registered by ``register()``
for the architecture names ``Qwen4ExpForConditionalGeneration``, ``Qwen4ExpForCausalLM`` and ``Qwen4ExpMTP``).

Each class is a subclass of the one vLLM picks for the platform (``vllm.models.qwen4_exp``): same forward, same
weights mapping; only the constructor runs inside the hook, and loading drops the vision tower's split q/k/v in
favour of the fused copy and checks the packed PLE tables' hashing. With any quantization but EXL3 the classes
behave exactly as vLLM's.

Importing this module imports vLLM's Qwen4Exp, whose vision tower needs torchvision.
"""

from __future__ import annotations

import vllm.models.qwen4_exp as _qwen4_exp

from .qwen4_exp import exl3_model_class

__all__ = ["Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration", "Qwen4ExpMTP"]

Qwen4ExpForConditionalGeneration = exl3_model_class(_qwen4_exp.Qwen4ExpForConditionalGeneration)
Qwen4ExpForCausalLM = exl3_model_class(_qwen4_exp.Qwen4ExpForCausalLM)
Qwen4ExpMTP = exl3_model_class(_qwen4_exp.Qwen4ExpMTP, draft=True)
