"""Every test here runs with sparkctl's state and cache directories in a temp dir."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path_factory.mktemp("sparkctl")
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(root / "state"))
    monkeypatch.setenv("SPARKCTL_CACHE_DIR", str(root / "cache"))
    monkeypatch.delenv("SPARKCTL_RECIPES_DIR", raising=False)
