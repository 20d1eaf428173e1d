"""`bench RECIPE --up` interrupted while the server starts: out within seconds, with an "interrupted" line,
and the server it started is stopped (no state, no process)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from ctrl_c import read_until_launch, sigint_default, slow_engine_recipe
from sparkctl_proc import sparkctl_env

pytestmark = pytest.mark.slow  # starts local processes (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def test_bench_up_interrupted_during_start_up_exits_fast_and_says_so(tmp_path: Path) -> None:
    recipe = slow_engine_recipe(tmp_path, "bup")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "bench", "run", str(recipe), "--up", "--no-html"],
        env=sparkctl_env(tmp_path),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=sigint_default,
        cwd=REPO,
    )
    assert proc.stderr is not None
    engine = None
    try:
        seen = read_until_launch(proc)
        record = json.loads((tmp_path / "state" / "servers" / "bup.json").read_text())
        engine = psutil.Process(record["pid"])
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        proc.wait(timeout=60)
        took = time.monotonic() - t0
        assert proc.returncode == 130, "".join(seen) + rest
        assert "interrupted" in rest and "Traceback" not in rest, rest
        assert took < 5, took
        assert not engine.is_running() or engine.status() == psutil.STATUS_ZOMBIE
        assert not (tmp_path / "state" / "servers" / "bup.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        if engine is not None and engine.is_running():
            engine.kill()
