"""Shared by the GGUF tests: the pinned llama-server and FreeToken's venv, when `make` has installed them.

Both are heavy installs (a 20-minute compile, a torch venv) that `make test` does once and caches; a test
that needs one skips with the make target that provides it when it is missing, and fails instead when
SPARKCTL_REQUIRE_ENGINES=1 (CI sets nothing: `make test` depends on both targets, so they are there).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sparkctl.planner import engine_bins


def _need(what: str, target: str) -> None:
    msg = f"{what} is not installed (make {target})"
    if os.environ.get("SPARKCTL_REQUIRE_ENGINES") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """The CPU llama-server the tiny GGUF recipes run (sparkctl's pinned build)."""
    cmd = shutil.which(engine_bins.llama_server_command("cpu"))
    if cmd is None:
        _need("llama-server", "llama-server")
    return Path(cmd)


@pytest.fixture(scope="session")
def freetoken_python() -> Path:
    """The Python of FreeToken's own venv (its parser needs torch 2.14, which the test venv lacks)."""
    py = engine_bins.freetoken_venv() / "bin" / "python"
    if not (engine_bins.freetoken_venv() / ".installed").exists() or not py.exists():
        _need("FreeToken", "freetoken")
    return py
