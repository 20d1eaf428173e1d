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
from ctrl_c import sigint_default
from sparkctl_proc import sparkctl_env

pytestmark = pytest.mark.slow  # starts local processes (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
ENGINE = Path(__file__).with_name("fake_engine.py")


def test_bench_up_interrupted_during_start_up_exits_fast_and_says_so(tmp_path: Path) -> None:
    recipe = tmp_path / "bup.yaml"
    argv = [sys.executable, str(ENGINE), "--slow-start", "600"]
    recipe.write_text(
        f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: bup\n"
        f"engine:\n  entrypoint: {json.dumps(argv)}\nserve:\n  health_timeout_s: 600\n"
    )
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
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "launch" in line:
                break
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
