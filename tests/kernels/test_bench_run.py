"""kernels/bench/run.py's own plumbing (the checks and timings themselves need a GPU and run on the device)."""

from __future__ import annotations

import importlib.util
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


def test_bench_registers_its_kernels(run_module) -> None:
    """run.py only runs on the GPU machine: a broken import or registry there would cost device time to find."""
    assert set(run_module.KERNELS) >= {"gemv"}
    for name, spec in run_module.KERNELS.items():
        assert spec.name == name and callable(spec.check) and callable(spec.bench)
