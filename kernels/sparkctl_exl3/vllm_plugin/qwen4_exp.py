"""What vLLM's Qwen4Exp needs to load an EXL3 pack, given without editing vLLM: the construction hook.

vLLM's Qwen4Exp (0.32 and 0.33) builds three things without asking the quantization config: both
``ParallelLMHead`` (the main model's and the MTP draft's) are made without ``quant_config``, so an EXL3 lm_head
has nowhere to load (``no module or parameter named 'lm_head.mul1'``); and the n-gram (PLE) table's storage
comes from ``Qwen4ExpPLEEmbeddingMethod.from_quant_config``, which knows FP8/NVFP4 only. The model classes in
``qwen4_exp_models`` (registered for vLLM's architecture names through the plugin entry point) run vLLM's own
constructor inside :func:`exl3_construction`, which, only while that constructor runs and only for an
``EXL3Config``, gives those two places our config: the lm_heads get it (so ``EXL3Config.get_quant_method``
picks the EXL3 or plain head by what the checkpoint stores) and the PLE table gets
``EXL3Config.ngram_method`` (packed, :mod:`.ple`). Any other quantization runs vLLM's code untouched.

This module imports no vLLM model code (vLLM's Qwen4Exp imports its vision tower, which needs torchvision),
so the hooks are tested on the CPU against vLLM's own PLE, lm_head and loader classes.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from torch import nn

from .config import EXL3Config
from .ple import check_ngram_hashing

logger = logging.getLogger("sparkctl_exl3.vllm_plugin")

_LOCK = threading.RLock()

#: ``...visual.blocks.<n>.attn.q.weight`` and friends: the vision tower's split projections (q/k/v, ``_proj`` too).
_VISION_SPLIT = re.compile(r"^(?P<attn>(?:.*\.)?visual\..*\.attn)\.(?:q|k|v)(?:_proj)?\.[A-Za-z0-9_]+$")


def draft_quant_config(vllm_config: Any) -> Any:
    """The quantization config vLLM gives a draft model's layers (its own, resolved like vLLM's MTP code does)."""
    if getattr(vllm_config, "speculative_config", None) is None:
        return vllm_config.quant_config
    from vllm.model_executor.models.utils import get_draft_quant_config

    return get_draft_quant_config(vllm_config)


@contextmanager
def exl3_construction(quant_config: Any, model_module: ModuleType) -> Iterator[None]:
    """While vLLM's Qwen4Exp constructor runs: lm_heads made in ``model_module`` (the module of vLLM's model class,
    whose ``ParallelLMHead`` name it looks up) get ``quant_config``, and the PLE table's method comes from
    ``quant_config.ngram_method``. A no-op unless ``quant_config`` is EXL3."""
    if not isinstance(quant_config, EXL3Config):
        yield
        return
    from vllm.models.qwen4_exp.common.ngram_embedding import Qwen4ExpPLEEmbeddingMethod

    with _LOCK:
        original_pick = Qwen4ExpPLEEmbeddingMethod.__dict__["from_quant_config"]
        original_head = getattr(model_module, "ParallelLMHead", None)
        head_config = quant_config

        def pick(config: Any, prefix: str, embedding_dtype: str | None = None) -> Any:
            if isinstance(config, EXL3Config):
                return config.ngram_method(prefix)
            return original_pick.__func__(config, prefix, embedding_dtype)

        Qwen4ExpPLEEmbeddingMethod.from_quant_config = staticmethod(pick)
        if original_head is not None:

            class EXL3AwareLMHead(original_head):  # type: ignore[misc, valid-type]
                """vLLM's ParallelLMHead, given the EXL3 config where vLLM's Qwen4Exp passes none."""

                def __init__(self, *args: Any, quant_config: Any = None, **kwargs: Any) -> None:
                    super().__init__(*args, quant_config=quant_config or head_config, **kwargs)

            model_module.ParallelLMHead = EXL3AwareLMHead
        try:
            yield
        finally:
            Qwen4ExpPLEEmbeddingMethod.from_quant_config = original_pick
            if original_head is not None:
                model_module.ParallelLMHead = original_head


def skip_split_vision_qkv(
    weights: Iterable[tuple[str, torch.Tensor]], quant_config: Any
) -> Iterator[tuple[str, torch.Tensor]]:
    """Drop the vision tower's split q/k/v tensors where the checkpoint also stores the fused ``attn.qkv``.

    Qwen3.8-Flash-Next's pack stores both: the split projections (what a converter quantizes) and the bf16
    fused copy that vLLM's vision tower (one ``attn.qkv`` layer) loads. Fed both, vLLM stacks the split ones onto
    the fused layer as shards and fails; the fused copy is the one to keep.
    """
    index = getattr(quant_config, "index", None)
    stored = (index.plain | index.exl3) if index is not None else set()
    skipped = 0
    for name, tensor in weights:
        m = _VISION_SPLIT.match(name)
        if m and f"{m['attn']}.qkv" in stored:
            skipped += 1
            continue
        yield name, tensor
    if skipped:
        logger.info(
            "exl3: skipped %d split vision q/k/v tensors in favour of the fused attn.qkv copy", skipped
        )


def check_ngram_tables(model: nn.Module) -> None:
    """After loading: every packed PLE table agrees with the n-gram ids vLLM will compute (see ple.py)."""
    for module in model.modules():
        if hasattr(module, "ngram_heads_offsets") and hasattr(module, "ngram_embedding"):
            check_ngram_hashing(module)


def exl3_model_class(base: type, *, draft: bool = False) -> type:
    """vLLM's model class ``base`` constructed inside :func:`exl3_construction` and loaded through the filters.

    The constructor keeps vLLM's keyword signature, ``prefix`` with vLLM's default included: vLLM's loader
    checks for ``vllm_config`` and ``prefix`` parameters and treats any other class as an old-style one. The hook
    swaps ``ParallelLMHead`` in the module ``base`` is defined in (its constructor's globals). ``draft``: the MTP
    drafter, whose lm_head gets the draft's own quantization config, as vLLM gives its other layers.
    """
    module = sys.modules[base.__module__]
    default_prefix = inspect.signature(base.__init__).parameters["prefix"].default

    def __init__(self: Any, *, vllm_config: Any, prefix: str = default_prefix) -> None:
        quant = draft_quant_config(vllm_config) if draft else vllm_config.quant_config
        with exl3_construction(quant, module):
            base.__init__(self, vllm_config=vllm_config, prefix=prefix)
        self._exl3_quant = quant

    def load_weights(self: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = base.load_weights(self, skip_split_vision_qkv(weights, self._exl3_quant))
        check_ngram_tables(self)
        return loaded

    return type(
        base.__name__,
        (base,),
        {
            "__init__": __init__,
            "load_weights": load_weights,
            "__module__": "sparkctl_exl3.vllm_plugin.qwen4_exp_models",
            "__qualname__": base.__name__,
            "__doc__": f"vLLM's {base.__name__} with the exl3 plugin's construction hook and load filters.",
        },
    )
