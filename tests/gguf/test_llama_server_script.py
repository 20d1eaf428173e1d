"""scripts/llama-server.sh (`make llama-server`): a cached build is reused at once, bad input is refused
before anything is downloaded or compiled."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sparkctl.planner import engine_bins

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llama-server.sh"


def test_a_cached_build_is_reused(llama_server: Path) -> None:
    if llama_server != engine_bins.cached_llama_server("cpu"):
        pytest.skip("llama-server comes from SPARKCTL_LLAMA_SERVER or PATH, not sparkctl's cache")
    t = time.monotonic()
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(llama_server)
    assert time.monotonic() - t < 10  # no download, no compile


def test_an_unknown_backend_is_refused_up_front(tmp_path: Path) -> None:
    env = {**os.environ, "LLAMA_BACKEND": "rocm", "XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    assert out.stderr.strip() == "llama-server: LLAMA_BACKEND must be cpu or cuda, not 'rocm'"
    assert list(tmp_path.iterdir()) == []  # nothing fetched or made
