"""Where sparkctl keeps its files, so every module agrees and tests can redirect them all.

`SPARKCTL_STATE_DIR` (running servers) and `SPARKCTL_CACHE_DIR` (generated models, builds) override
the XDG defaults; tests point both at temp directories.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """One JSON file per running server lives under `servers/` here."""
    env = os.environ.get("SPARKCTL_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sparkctl"


def cache_dir() -> Path:
    """Regenerable data: locally generated tiny models, logs of past runs."""
    env = os.environ.get("SPARKCTL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkctl"


def generated_model_dir(generator: str) -> Path:
    """The directory a named model generator writes into (made on first use, then reused)."""
    return cache_dir() / "models" / generator


def logs_dir() -> Path:
    return state_dir() / "logs"


def api_key_file(recipe: str) -> Path:
    """The env file (`VLLM_API_KEY=...`, mode 0600) that hands a recipe's API key to its engine: never on a
    command line, in a log or in a rendered file, which only name this path."""
    return state_dir() / "keys" / f"{file_stem(recipe)}.env"


def file_stem(recipe: str) -> str:
    """A recipe name as a file name: characters a file name cannot hold flattened, and a name past what a
    filesystem takes (NAME_MAX is 255 bytes) cut, with a hash of the whole name so two long names differ."""
    import hashlib
    import re

    name = re.sub(r"[^A-Za-z0-9._-]+", "_", recipe).strip("._") or "recipe"
    if len(name) > 120:
        name = f"{name[:100]}-{hashlib.sha256(recipe.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"
    return name
