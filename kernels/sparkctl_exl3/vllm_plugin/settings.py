"""Plugin settings, read from ``VLLM_EXL3_*`` environment variables.

Environment variables rather than CLI flags because the plugin runs in every vLLM process (API server,
engine core, workers, Ray workers on other nodes) and vLLM's argument parser belongs to vLLM. The
``VLLM_`` prefix matters: Ray copies ``VLLM_*`` variables to its workers and drops most others.

Each setting is read when it is needed (not cached at import), so tests and long-lived processes see
the current environment. A bad value raises ``ValueError`` naming the variable and the accepted values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: name -> (default, accepted values, what it does). The README table is written from this.
SETTINGS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "VLLM_EXL3_OP_DTYPE": (
        "auto",
        ("auto", "float16", "model"),
        "activation dtype at the EXL3 op boundary: `auto` = float16 on CUDA (the kernels are fp16-only), "
        "the model's dtype elsewhere (the CPU reference computes in fp32); `float16` / `model` force one",
    ),
    "VLLM_EXL3_SCAN_CHECKPOINT": (
        "1",
        ("0", "1"),
        "`1`: read the safetensors headers of a local model at startup to learn which modules are EXL3 "
        "and which are plain `.weight` (e.g. an unquantized lm_head); `0`: treat every linear as EXL3",
    ),
    "VLLM_EXL3_LOG_LAYERS": (
        "0",
        ("0", "1"),
        "`1`: log K, codebook and shape of every EXL3 layer as it finishes loading",
    ),
}


@dataclass(frozen=True)
class Settings:
    op_dtype: str
    scan_checkpoint: bool
    log_layers: bool


def _get(name: str) -> str:
    default, accepted, _ = SETTINGS[name]
    value = os.environ.get(name, "").strip().lower() or default
    if value not in accepted:
        raise ValueError(
            f"{name}={os.environ.get(name)!r} is not valid: expected one of {', '.join(accepted)}"
        )
    return value


def load() -> Settings:
    """The current settings; raises ValueError on an invalid value."""
    return Settings(
        op_dtype=_get("VLLM_EXL3_OP_DTYPE"),
        scan_checkpoint=_get("VLLM_EXL3_SCAN_CHECKPOINT") == "1",
        log_layers=_get("VLLM_EXL3_LOG_LAYERS") == "1",
    )
