"""The import contracts in pyproject.toml ([tool.importlinter]) hold: the layers of DEVELOPERS.md, and the
plugin and prewarm never importing sparkctl. Run under `make test` so CI enforces them (also `make lint`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _lint_imports() -> str:
    beside = Path(sys.executable).parent / "lint-imports"
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    assert found, "lint-imports is missing: it comes with the dev extras (make install)"
    return found


def test_import_contracts_hold() -> None:
    # this checkout's packages, not whatever an editable install points at
    path = os.pathsep.join([str(REPO), str(REPO / "kernels"), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [_lint_imports(), "--no-cache", "--no-logo"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
