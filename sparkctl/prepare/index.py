"""A `model.safetensors.index.json` that lists every tensor file of a pack.

vLLM (and transformers) load only the files the index's `weight_map` names when an index exists. An
index written before extra files were added to a pack (exllamav3's converter writes the n-gram table
`ngram_embedding.safetensors` after the index; Qwen3.8-Flash-Next also ships
`mtp_hyper_connection_mixer_patch.safetensors`) silently drops those tensors, so the index is
rebuilt from the files' own headers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import RuntimeFailure
from sparkctl.prepare.headers import Header

INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class IndexPlan:
    """The regenerated index and how it differs from the one the pack shipped."""

    weight_map: dict[str, str]  # tensor name -> file name
    total_size: int
    files: tuple[str, ...]
    added_files: tuple[str, ...]  # files the shipped index did not name (all of them without an index)
    dropped_files: tuple[str, ...]  # files the shipped index names that do not exist
    shipped: bool  # the pack had an index

    def to_json(self) -> str:
        doc = {
            "metadata": {"total_size": self.total_size},
            "weight_map": dict(sorted(self.weight_map.items())),
        }
        return json.dumps(doc, indent=2) + "\n"

    def describe(self) -> str:
        what = f"{INDEX_NAME}: {len(self.weight_map)} tensors in {len(self.files)} files"
        if not self.shipped:
            return what + " (the pack has no index)"
        if self.added_files:
            what += ", adds " + ", ".join(self.added_files)
        if self.dropped_files:
            what += ", drops missing " + ", ".join(self.dropped_files)
        if not self.added_files and not self.dropped_files:
            what += " (same files as the shipped index)"
        return what


def plan_index(model_dir: Path, headers: list[Header]) -> IndexPlan:
    """Map every tensor to its file; a tensor stored in two files is refused (which copy loads is undefined)."""
    weight_map: dict[str, str] = {}
    for h in headers:
        for name in h.tensors:
            other = weight_map.get(name)
            if other is not None:
                raise RuntimeFailure(
                    f"{model_dir}: tensor {name} is stored in both {other} and {h.path.name}; "
                    "cannot tell which one the engine should load",
                    hint="remove the stale file from the pack (or pin a revision that has one copy)",
                )
            weight_map[name] = h.path.name
    files = tuple(h.path.name for h in headers)
    shipped_files = _shipped_files(Path(model_dir) / INDEX_NAME)
    shipped = shipped_files is not None
    named = shipped_files or set()
    return IndexPlan(
        weight_map=weight_map,
        total_size=sum(h.data_bytes for h in headers),
        files=files,
        added_files=tuple(f for f in files if f not in named),
        dropped_files=tuple(sorted(named - set(files))),
        shipped=shipped,
    )


def _shipped_files(path: Path) -> set[str] | None:
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        return {str(f) for f in doc["weight_map"].values()}
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return set()  # unreadable: every file counts as added, and the rebuilt index replaces it
