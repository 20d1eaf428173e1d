"""Where a model's weights come from, as the planner hands it to `models.fetch`.

It lives here, below the planner, so that fetching and generating models never imports the planner
(the layers run recipe -> planner; `sparkctl.planner.types` re-exports it for the Plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class PrepareSteps:
    """What the prepare stage makes of a pack before the engine loads it (recipe `model.prepare`).

    Done in an overlay directory of links (`overlay`, keyed by the pack and its revision): the
    download itself is never written.
    """

    index: bool = False  # regenerate model.safetensors.index.json from every tensor file's header
    config: bool = False  # rewrite config.json's quantization_config for the exl3 plugin
    chat_template: str | None = None  # a template shipped in sparkctl/prepare/templates, by name
    overlay: str = ""  # host directory the prepared pack appears in


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
    prepare: PrepareSteps | None = None  # served from a prepared overlay instead of the download
