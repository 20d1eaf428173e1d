"""kernels/bench/run.py's own plumbing (the checks and timings themselves need a GPU and run on the device)."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_module import loaded

RUN_PY = Path(__file__).resolve().parents[2] / "kernels" / "bench" / "run.py"


@pytest.fixture(scope="module")
def run_module():
    yield from loaded(RUN_PY, "kernels_bench_run")


def test_bench_registers_its_kernels(run_module) -> None:
    """run.py only runs on the GPU machine: a broken import or registry there would cost device time to find."""
    assert set(run_module.KERNELS) >= {"gemv"}
    for name, spec in run_module.KERNELS.items():
        assert spec.name == name and callable(spec.check) and callable(spec.bench)
