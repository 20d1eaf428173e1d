"""Every test here runs with sparkctl's state and cache directories in a temp dir (see tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(isolated_dirs: None) -> None:
    pass
