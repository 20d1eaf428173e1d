"""One adapter per engine: everything sparkctl knows about vLLM, llama.cpp (llama-server) and FreeToken.

Adding an engine means one file here (an `EngineAdapter`) and its part of the recipe schema (a class in
the `EngineSpec` union of sparkctl/recipe/schema.py, with its own `serve` section); no other
module branches on an engine's name, they ask its adapter (`adapter_for(plan.engine)`).
"""

from __future__ import annotations

from sparkctl.errors import UserError
from sparkctl.planner.adapters.base import EngineAdapter
from sparkctl.planner.adapters.freetoken import FREETOKEN
from sparkctl.planner.adapters.llama_cpp import LLAMA_CPP
from sparkctl.planner.adapters.vllm import VLLM

ADAPTERS: dict[str, EngineAdapter] = {a.name: a for a in (VLLM, LLAMA_CPP, FREETOKEN)}

__all__ = ["ADAPTERS", "EngineAdapter", "adapter_for"]


def adapter_for(name: str) -> EngineAdapter:
    """The adapter of an engine name (a recipe's `engine.name`, a plan's `engine`)."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise UserError(f"unknown engine {name!r}", hint=f"valid: {', '.join(ADAPTERS)}") from None
