"""Where a model's weights come from, as the planner hands it to `models.fetch`.

It lives here, below the planner, so that fetching and generating models never imports the planner
(the layers run recipe -> planner; `sparkctl.planner.types` re-exports it for the Plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from; exactly one of repo / path / generate is set."""

    repo: str | None = None  # Hugging Face repo id, fetched with snapshot_download
    revision: str | None = None  # pinned commit or branch
    allow_patterns: tuple[str, ...] = ()
    path: str | None = None  # a local directory already holding the model
    generate: str | None = None  # name of a local generator (tiny models made on first use)
    format: Literal["exl3", "gguf", "safetensors"] = "safetensors"
    expected_shards: int | None = None
    expected_bytes: int | None = None
    needs_token: bool = False  # gated repo: doctor checks for an HF token
