"""Root of the test suite. Having a conftest here puts `tests/` on sys.path, so the suite's few shared helper
modules (`plans`, `ctrl_c`, `procs`) import from any test directory; it also holds the one isolation fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# These reuse the machine's JIT build of the EXL3 CUDA extension, kept under the sparkctl cache: a fresh
# cache per test would recompile it (minutes on a GPU machine). Their state directory is still isolated.
SHARED_CACHE = {"kernels", "plugin"}


@pytest.fixture(autouse=True)
def isolated_dirs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test runs with sparkctl's state and cache directories in a fresh temp dir and no user recipe
    directory, so no test sees (or leaves) a server, a log or a generated model of another one or of the
    user. Returns that root."""
    root = tmp_path_factory.mktemp("sparkctl")
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(root / "state"))
    try:
        top = Path(str(request.node.path)).resolve().relative_to(TESTS).parts[0]
    except ValueError:
        top = ""
    if top not in SHARED_CACHE:
        monkeypatch.setenv("SPARKCTL_CACHE_DIR", str(root / "cache"))
    monkeypatch.delenv("SPARKCTL_RECIPES_DIR", raising=False)
    return root
