"""Root of the test suite. Having a conftest here puts `tests/` on sys.path, so the suite's few shared helper
modules (such as `ctrl_c`) import from any test directory; it also holds the fixtures several directories use."""

from __future__ import annotations

import pytest


@pytest.fixture
def isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """sparkctl's state and cache directories in a fresh temp dir, and no user recipe directory: for tests that
    run sparkctl in-process (the directories that want it for every test use it from an autouse fixture)."""
    root = tmp_path_factory.mktemp("sparkctl")
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(root / "state"))
    monkeypatch.setenv("SPARKCTL_CACHE_DIR", str(root / "cache"))
    monkeypatch.delenv("SPARKCTL_RECIPES_DIR", raising=False)
