"""Ctrl-C twice during `up`: the second one makes the clean-up faster (SIGKILL at once), never skips it.

The engine ignores SIGTERM, so the clean-up of the first Ctrl-C waits out its grace period; the second
Ctrl-C lands in that wait. Before, it aborted the clean-up: `up` said it had stopped what it started,
and the server ran on with its state file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from ctrl_c import read_until_launch, sigint_default, slow_engine_recipe
from sparkctl_proc import sparkctl_env

from sparkctl.server.ports import free_port

pytestmark = pytest.mark.slow  # starts local processes (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def test_a_second_ctrl_c_during_clean_up_still_stops_the_server(tmp_path: Path) -> None:
    recipe = slow_engine_recipe(tmp_path, "twice", "--ignore-sigterm")
    up = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "up", str(recipe), "--port", str(free_port())],
        env=sparkctl_env(tmp_path),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=sigint_default,
        cwd=REPO,
    )
    assert up.stderr is not None
    engine = None
    try:
        read_until_launch(up)
        record = json.loads((tmp_path / "state" / "servers" / "twice.json").read_text())
        engine = psutil.Process(record["pid"])
        time.sleep(1.0)  # in the health wait
        up.send_signal(signal.SIGINT)
        time.sleep(1.5)  # in the clean-up: SIGTERM sent, ignored, waiting out the grace period
        assert up.poll() is None and engine.is_running()
        t0 = time.monotonic()
        up.send_signal(signal.SIGINT)
        rest = up.stderr.read()
        up.wait(timeout=30)
        took = time.monotonic() - t0
        assert up.returncode == 130, rest
        assert "Traceback" not in rest and "interrupted" in rest
        assert took < 8, took  # faster than the 15 s grace period it cut short
        assert not engine.is_running() or engine.status() == psutil.STATUS_ZOMBIE
        assert not (tmp_path / "state" / "servers" / "twice.json").exists()
    finally:
        if up.poll() is None:
            up.kill()
        if engine is not None and engine.is_running():
            os.kill(engine.pid, signal.SIGKILL)
