"""Where a prepared pack's overlay lives: decided from the recipe alone, so `show` and `up --dry-run`
name the same directory `up` serves from.

`<sparkctl cache>/packs/<source>/<revision>-<steps>`: the source is the hub repo (or a local model
directory, or a generator), the revision the recipe's pin, and `<steps>` a short hash of the prepare
steps, so two recipes preparing the same pack differently never share (and never swap) an overlay.
When a branch pin moves, the overlay's marker no longer matches the snapshot and it is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from sparkctl import paths

#: bump when what the stage writes changes: every existing overlay is then rebuilt once
PREPARE_VERSION = 1


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def steps_key(index: bool, config: bool, chat_template: str | None) -> str:
    blob = json.dumps([PREPARE_VERSION, index, config, chat_template]).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def overlay_dir(
    *,
    repo: str | None,
    revision: str | None,
    path: str | None,
    generate: str | None,
    index: bool,
    config: bool,
    chat_template: str | None,
) -> Path:
    """The overlay directory for one pack and one set of steps (nothing is created here)."""
    if repo:
        source = "hub--" + _safe(repo.replace("/", "--"))
    elif path:
        real = os.path.abspath(os.path.expanduser(path))
        source = f"local--{_safe(Path(real).name)}-{hashlib.sha256(real.encode()).hexdigest()[:8]}"
    else:
        source = "generated--" + _safe(generate or "model")
    rev = _safe(revision or "main") if repo else "local"
    return paths.cache_dir() / "packs" / source / f"{rev}-{steps_key(index, config, chat_template)}"
