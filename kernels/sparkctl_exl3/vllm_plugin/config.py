"""The ``exl3`` quantization config: which vLLM layer gets which method.

vLLM builds this from ``config.json``'s ``quantization_config`` (``quant_method: exl3``) or from
``--quantization exl3`` (then from ``quantization_config.json``). Only ``quant_method`` is binding
(SPEC 1.4): K and the codebook come from each tensor's shape and marker. What the config cannot say is
which modules are EXL3 at all, so for a local model we read the safetensors headers once
(``storage.scan_checkpoint``): an lm_head or a layer stored as plain ``.weight`` gets vLLM's unquantized
method, everything with a ``.trellis`` gets ours.
"""

from __future__ import annotations

import logging
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
    VocabParallelEmbedding,
)

from .. import reference
from . import settings, storage
from .linear import EXL3LinearMethod, Exl3LoadError
from .moe import EXL3MoEMethod

logger = logging.getLogger("sparkctl_exl3.vllm_plugin")


class EXL3Config(QuantizationConfig):
    """Quantization config for EXL3 checkpoints (exllamav3 format, SPEC 1)."""

    def __init__(
        self,
        *,
        bits: float | None = None,
        head_bits: float | None = None,
        codebook: str | None = None,
        version: str | None = None,
    ) -> None:
        super().__init__()
        self.bits = bits
        self.head_bits = head_bits
        self.codebook = codebook
        self.version = version
        self.index: storage.CheckpointIndex | None = None
        self.tie_word_embeddings = False
        self._mapper: Any = None
        self._mapped: tuple[set[str], set[str]] | None = None  # index names through _mapper, made once

    def __repr__(self) -> str:
        return f"EXL3Config(bits={self.bits}, head_bits={self.head_bits}, codebook={self.codebook})"

    # -- the QuantizationConfig interface ---------------------------------------------------------

    def get_name(self) -> str:
        return "exl3"

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        # The op casts at its boundary (fp16 for the CUDA kernels); the model may run in any of these.
        return [torch.float16, torch.bfloat16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80  # mma.sync m16n8k16 and cp.async: Ampere and later, GB10 (121) included

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["quantization_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> EXL3Config:
        method = str(config.get("quant_method", "exl3")).lower()
        if method != "exl3":
            raise ValueError(f"quantization_config has quant_method {method!r}, not 'exl3'")
        codebook = config.get("codebook")
        if codebook is not None and codebook not in reference.CODEBOOKS:
            # informational only (SPEC 1.4); the per-tensor markers decide, and are checked at load
            logger.warning(
                "exl3: quantization_config names an unknown codebook %r; using per-tensor markers", codebook
            )
        return cls(
            bits=config.get("bits"),
            head_bits=config.get("head_bits"),
            codebook=codebook,
            version=config.get("version"),
        )

    def maybe_update_config(
        self, model_name: str, hf_config: Any = None, revision: str | None = None
    ) -> None:
        """Learn which modules the checkpoint stores as EXL3 (local directories only; no network)."""
        if hf_config is not None:
            text = getattr(hf_config, "get_text_config", lambda: hf_config)()
            self.tie_word_embeddings = bool(getattr(text, "tie_word_embeddings", False))
        if not settings.load().scan_checkpoint:
            return
        path = Path(model_name)
        if not path.is_dir():
            return  # a hub id: vLLM downloads later; every linear is then taken to be EXL3
        index = storage.scan_checkpoint(path)
        if index.row_codec:
            raise Exl3LoadError(
                f"{model_name}: {sorted(index.row_codec)[0]} is stored in exllamav3's quantized-embedding row "
                "codec (--embed_bits: .trellis + .signs), which the plugin does not load; convert the model "
                "with embeddings left unquantized (the default)"
            )
        if index.files and not index.exl3:
            if index.legacy:
                raise Exl3LoadError(
                    f"{model_name}: this EXL3 checkpoint uses the pre-release su/sv sign format "
                    f"(e.g. {sorted(index.legacy)[0]}), which the plugin does not load"
                )
            raise Exl3LoadError(
                f"{model_name}: config.json declares quant_method exl3 but no safetensors file holds an EXL3 "
                "tensor (<module>.trellis / .suh / .svh); this looks like an unquantized checkpoint"
            )
        self.index = index if index.files else None
        self._mapped = None

    def apply_vllm_mapper(self, hf_to_vllm_mapper: Any) -> None:
        self._mapper = hf_to_vllm_mapper
        self._mapped = None

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, ParallelLMHead):
            kind = self._storage_of(prefix, [prefix])
            if kind == "plain" or (kind is None and self.tie_word_embeddings):
                return UnquantizedEmbeddingMethod()
            if kind is None and self.index is not None and prefix.rpartition(".")[2] != "lm_head":
                # A head the checkpoint holds nothing for, inside the model (an MTP layer's shared_head.head,
                # vLLM prefix model.layers.<N>.head): vLLM's MTP proposer always replaces it with the
                # target's lm_head after loading, so a plain placeholder, not an EXL3 layer that would
                # refuse to finish loading without its trellis.
                return UnquantizedEmbeddingMethod()
            return EXL3LinearMethod(self, prefix, vocab=True)
        if isinstance(layer, VocabParallelEmbedding):
            return UnquantizedEmbeddingMethod()  # embeddings stay unquantized (SPEC 1.5)
        if isinstance(layer, LinearBase):
            parent, _, last = prefix.rpartition(".")
            parts = self.packed_modules_mapping.get(last) or [last]
            names = [f"{parent}.{p}" if parent else p for p in parts]
            if self._storage_of(prefix, names) == "plain":
                return UnquantizedLinearMethod()
            return EXL3LinearMethod(self, prefix)
        if isinstance(layer, RoutedExperts):
            if self._experts_storage(prefix) == "plain":
                return UnquantizedFusedMoEMethod(layer.moe_config)
            return EXL3MoEMethod(self, layer.moe_config, prefix)
        return None

    def ngram_method(self, prefix: str) -> QuantizeMethodBase:
        """The storage of Qwen4Exp's n-gram (PLE) table at vLLM prefix ``prefix`` (vLLM never asks
        ``get_quant_method`` for it; our model hook does, see ``qwen4_exp.exl3_construction``)."""
        from vllm.models.qwen4_exp.common.ngram_embedding import Qwen4ExpPLEUnquantizedEmbeddingMethod

        from .ple import EXL3NgramEmbeddingMethod

        if self.index is None:
            raise Exl3LoadError(
                f"{prefix}: the packed n-gram (PLE) table's layout is read from the checkpoint's safetensors "
                "headers: serve a local model directory (with VLLM_EXL3_SCAN_CHECKPOINT=1, the default)"
            )
        tables = dict(self.index.ngram)
        if self._mapper is not None:
            for name, info in self.index.ngram.items():
                mapped = self._mapper.apply_list([name])
                if mapped:
                    tables[mapped[0]] = info
        info = tables.get(prefix)
        if info is None:
            if any(n.startswith(prefix + ".") for n in chain(self.index.plain, self._mapped_names()[1])):
                return Qwen4ExpPLEUnquantizedEmbeddingMethod()  # stored unquantized (.shard_<n>.weight)
            known = ", ".join(sorted(self.index.ngram)) or "none"
            raise Exl3LoadError(
                f"{prefix}: no n-gram (PLE) table for this layer in the checkpoint (packed tables found: {known}); "
                "is ngram_embedding.safetensors in the model directory?"
            )
        return EXL3NgramEmbeddingMethod(prefix, info)

    # -- which modules are EXL3 -------------------------------------------------------------------

    def _mapped_names(self) -> tuple[set[str], set[str]]:
        """The index's EXL3 and plain names as vLLM renames them (empty without a mapper).

        Made once per index and mapper: every layer asks, and mapping runs over every module name of
        the checkpoint (tens of thousands for a large MoE): redone per layer, that was seconds of start-up.
        """
        assert self.index is not None
        if self._mapper is None:
            return set(), set()
        if self._mapped is None:
            self._mapped = (
                set(self._mapper.apply_list(sorted(self.index.exl3))),
                set(self._mapper.apply_list(sorted(self.index.plain))),
            )
        return self._mapped

    def _storage_of(self, prefix: str, names: list[str]) -> str | None:
        """ "exl3", "plain" or None (not known) for the checkpoint modules behind one vLLM layer."""
        if self.index is None:
            return None
        kinds = {self._kind(n) for n in names}
        if "exl3" in kinds and "plain" in kinds:
            raise Exl3LoadError(
                f"{prefix}: the checkpoint stores some of {', '.join(names)} as EXL3 and others as plain "
                "weights; vLLM fuses them into one layer, which must be all one or the other"
            )
        if kinds == {"plain"}:
            return "plain"
        return "exl3" if "exl3" in kinds else None

    def _kind(self, name: str) -> str | None:
        assert self.index is not None
        mapped_exl3, mapped_plain = self._mapped_names()
        if name in self.index.exl3 or name in mapped_exl3:
            return "exl3"
        if name in self.index.plain or name in mapped_plain:
            return "plain"
        return None

    def _experts_storage(self, prefix: str) -> str | None:
        if self.index is None:
            return None
        mapped_exl3, mapped_plain = self._mapped_names()
        head = prefix + "."
        if any(n.startswith(head) for n in chain(self.index.exl3, mapped_exl3)):
            return "exl3"
        if any(n.startswith(head) for n in chain(self.index.plain, mapped_plain)):
            return "plain"
        return None
