"""Golden files: the exact command line (and compose file) every built-in recipe renders to.

A change to a recipe, a default or the planner shows up here as a diff a reviewer can read. After an
intended change, regenerate with:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/planner/test_golden_commands.py

Machine-specific parts are normalised: the Python executable becomes `{python}`, the home directory
`/home/user`, and the sparkctl cache `/cache/sparkctl`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sparkctl.planner import plan
from sparkctl.planner.render import render
from sparkctl.recipe import builtin_names, load_recipe

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


@pytest.fixture(autouse=True)
def _fixed_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.setenv("SPARKCTL_CACHE_DIR", "/cache/sparkctl")
    # the engines sparkctl builds (llama-server, FreeToken's venv) are looked up under $HOME's cache
    for var in ("XDG_CACHE_HOME", "SPARKCTL_ENGINES_DIR", "SPARKCTL_LLAMA_SERVER", "SPARKCTL_FREETOKEN"):
        monkeypatch.delenv(var, raising=False)


def normalise(text: str) -> str:
    return text.replace(sys.executable, "{python}")


def check(name: str, text: str) -> None:
    path = GOLDEN / name
    text = normalise(text)
    if UPDATE:
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"no golden file {path}; create it with UPDATE_GOLDEN=1")
    assert text == path.read_text(), f"{name} changed; if intended, regenerate with UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", builtin_names())
def test_shell_command_matches_golden(name: str) -> None:
    p = plan(load_recipe(name), check_memory=False)
    check(f"{name}.sh", render(p, "shell"))


@pytest.mark.parametrize("name", [n for n in builtin_names() if load_recipe(n).runtime == "docker"])
def test_compose_file_matches_golden(name: str) -> None:
    p = plan(load_recipe(name), check_memory=False)
    check(f"{name}.compose.yaml", render(p, "compose"))


def test_no_stale_golden_files() -> None:
    """A golden file for a recipe that no longer exists is dead weight that hides renames."""
    names = set(builtin_names())
    stale = sorted(
        f.name for f in GOLDEN.iterdir() if f.name.split(".sh")[0].split(".compose.yaml")[0] not in names
    )
    assert stale == []
