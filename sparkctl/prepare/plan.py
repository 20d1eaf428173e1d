"""The prepare planner: which files of a pack the overlay links, which it writes, and why.

It only reads (directory listings, safetensors headers, config.json, the shipped index), so `show`,
`up --dry-run` and `sparkctl prepare --dry-run` can print exactly what `up` will do. `apply.py` does it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.models.source import PrepareSteps
from sparkctl.prepare.chat_templates import template_text
from sparkctl.prepare.headers import read_headers
from sparkctl.prepare.index import INDEX_NAME, plan_index
from sparkctl.prepare.layout import PREPARE_VERSION
from sparkctl.prepare.pack_config import rewrite_config

CHAT_TEMPLATE_NAME = "chat_template.jinja"
MARKER = ".sparkctl-prepare.json"
_SKIP_DIRS = {".cache", ".git"}  # hf local_dir bookkeeping, a git checkout's store


def describe_steps(steps: PrepareSteps) -> list[str]:
    """The steps in words, from the recipe alone (the pack need not be downloaded)."""
    lines = [f"overlay {steps.overlay}: every file of the download linked, never written"]
    if steps.index:
        lines.append(f"{INDEX_NAME} regenerated from every *.safetensors header (all tensor files listed)")
    if steps.config:
        lines.append(
            "config.json rewritten for the exl3 plugin: quantization_config (declaration, codebook, "
            "n-gram table), tie_word_embeddings"
        )
    if steps.chat_template:
        lines.append(
            f"{CHAT_TEMPLATE_NAME} = sparkctl's {steps.chat_template} template, passed as --chat-template"
        )
    return lines


@dataclass(frozen=True)
class PreparePlan:
    source: Path  # the downloaded (or local) model directory, resolved
    overlay: Path
    links: tuple[tuple[str, str], ...]  # overlay-relative path -> absolute target in the download
    writes: dict[str, bytes] = field(default_factory=dict)  # overlay-relative path -> content
    steps: tuple[str, ...] = ()
    fingerprint: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "source": str(self.source),
            "overlay": str(self.overlay),
            "links": len(self.links),
            "writes": sorted(self.writes),
            "steps": list(self.steps),
            "fingerprint": self.fingerprint,
        }


def plan_prepare(steps: PrepareSteps, source_dir: Path) -> PreparePlan:
    """What the overlay for `source_dir` must hold; raises when the overlay would land inside it."""
    source = Path(os.path.realpath(source_dir))
    overlay = Path(os.path.abspath(steps.overlay))
    _refuse_inside(overlay, source)
    links = _links(source)
    names = {rel for rel, _ in links}
    writes: dict[str, bytes] = {}
    lines: list[str] = []
    headers = read_headers(source) if steps.index or steps.config else []

    if steps.index:
        index = plan_index(source, headers)
        if index.added_files or index.dropped_files or (not index.shipped and len(index.files) > 1):
            writes[INDEX_NAME] = index.to_json().encode()
        lines.append(index.describe() if INDEX_NAME in writes else index.describe() + ": kept")
    if steps.config:
        config_path = source / "config.json"
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise RuntimeFailure(f"{config_path}: cannot read the pack's config ({exc})") from exc
        new, changes = rewrite_config(config, headers)
        if changes:
            writes["config.json"] = (json.dumps(new, indent=2) + "\n").encode()
            lines += [f"config.json: {c}" for c in changes]
        else:
            lines.append("config.json: already as the exl3 plugin reads it (kept)")
    if steps.chat_template:
        writes[CHAT_TEMPLATE_NAME] = template_text(steps.chat_template).encode()
        replaced = " (replaces the pack's own)" if CHAT_TEMPLATE_NAME in names else ""
        lines.append(f"{CHAT_TEMPLATE_NAME}: sparkctl's {steps.chat_template} template{replaced}")

    links = tuple((rel, target) for rel, target in links if rel not in writes)
    lines.insert(0, f"{len(links)} file(s) linked from {source}")
    digest = hashlib.sha256()
    digest.update(json.dumps([PREPARE_VERSION, str(source), links]).encode())
    for _, target in links:
        digest.update(str(os.stat(target).st_size).encode())
    for rel in sorted(writes):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(writes[rel]).digest())
    return PreparePlan(
        source=source,
        overlay=overlay,
        links=links,
        writes=writes,
        steps=tuple(lines),
        fingerprint=digest.hexdigest(),
    )


def _links(source: Path) -> list[tuple[str, str]]:
    """Every file below `source` and the real file it is (HF snapshots hold links into blobs/)."""
    if not source.is_dir():
        raise RuntimeFailure(f"cannot prepare {source}: not a directory")
    out: list[tuple[str, str]] = []
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(files):
            if name == MARKER:
                continue
            entry = Path(root) / name
            target = os.path.realpath(entry)
            if not os.path.isfile(target):
                raise RuntimeFailure(
                    f"{entry} points at {target}, which does not exist",
                    hint="the download is incomplete: run `sparkctl up` again without --offline to resume it",
                )
            out.append((entry.relative_to(source).as_posix(), target))
    return out


def _refuse_inside(overlay: Path, source: Path) -> None:
    """The overlay must never be written into the download (or its Hugging Face cache folder)."""
    guarded = [source]
    if source.parent.name == "snapshots":  # <cache>/models--owner--name/snapshots/<commit>
        guarded.append(source.parent.parent)
    real = Path(os.path.realpath(overlay))
    for g in guarded:
        if real == g or g in real.parents:
            raise UserError(
                f"the prepare overlay {overlay} would be inside the download {g}",
                hint="point SPARKCTL_CACHE_DIR outside the Hugging Face cache",
            )
