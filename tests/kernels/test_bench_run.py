"""kernels/bench/run.py's own plumbing (the checks and timings themselves need a GPU and run on the device)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

RUN_PY = Path(__file__).resolve().parents[2] / "kernels" / "bench" / "run.py"


@pytest.fixture(scope="module")
def run_module():
    spec = importlib.util.spec_from_file_location("kernels_bench_run", RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_env_switches_are_put_back_as_they_were(run_module, monkeypatch):
    """A switch the caller set for the whole run (an A/B setting) survives a check that sets it for a block."""
    monkeypatch.setenv("SPARKCTL_EXL3_I8_MAX_ROWS", "4")
    monkeypatch.delenv("SPARKCTL_EXL3_XPREP_MIN_ROWS", raising=False)
    with run_module._env(SPARKCTL_EXL3_I8_MAX_ROWS="8", SPARKCTL_EXL3_XPREP_MIN_ROWS="99"):
        assert os.environ["SPARKCTL_EXL3_I8_MAX_ROWS"] == "8"
        assert os.environ["SPARKCTL_EXL3_XPREP_MIN_ROWS"] == "99"
    assert os.environ["SPARKCTL_EXL3_I8_MAX_ROWS"] == "4"
    assert "SPARKCTL_EXL3_XPREP_MIN_ROWS" not in os.environ
