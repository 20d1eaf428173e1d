"""Regression guard for the 0.5 s budget of list/show/render/validate/schema.

The real numbers come from bench/cli_latency.py (see bench/PERF.md); this test only catches the
regressions that matter by an order of magnitude: a catalog command importing torch, vLLM, docker or
httpx, or becoming several times slower. The bound is generous because CI shares 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "vllm", "docker", "httpx", "huggingface_hub", "numpy", "psutil", "transformers")

PROBE = """
import sys
from sparkctl.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("LOADED=" + ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["show", "glm-5.3-flash"],
        ["render", "glm-5.3-flash", "--format", "compose"],
        ["validate", "tiny", "qwen3.8-flash-next"],
        ["schema"],
        ["--help"],
    ],
)
def test_catalog_commands_do_not_import_heavy_modules(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "120"},
    )
    loaded = next(line for line in proc.stderr.splitlines() if line.startswith("LOADED="))
    assert loaded == "LOADED=", f"`sparkctl {' '.join(args)}` imported {loaded[7:]}"


def test_list_answers_quickly_in_a_fresh_process() -> None:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "sparkctl", "list"], capture_output=True, text=True, timeout=60, cwd=REPO
        )
        best = min(best, time.perf_counter() - start)
        assert proc.returncode == 0, proc.stderr
    assert best < 1.5, f"`python -m sparkctl list` took {best:.2f} s at best (bench/PERF.md: ~0.3 s unloaded)"
