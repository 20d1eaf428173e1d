"""`down` signals only processes sparkctl started, whatever the state file says (runtimes.identity).

Each victim is a real process tree that is not a sparkctl server: a session leader with a child that
moved to a group of its own. A forged record copies everything a record can hold about it (pid, start
time, process group, command line); `down` must leave every process alive. A record that names the
test's own process (an ancestor of `down`) or pid 1 must not be signalled either.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sparkctl_proc import run_sparkctl

pytestmark = pytest.mark.slow  # starts local processes (tests/conftest.py)

TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setpgid(0, 0); time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.fixture
def victim() -> Iterator[list[psutil.Process]]:
    """A process tree that is not ours: leader (own session) + a child in another process group."""
    leader = subprocess.Popen(
        [sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert leader.stdout is not None
    child = psutil.Process(int(leader.stdout.readline()))
    time.sleep(0.3)
    procs = [psutil.Process(leader.pid), child]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        leader.wait()


def _forge(tmp_path: Path, recipe: str, proc: psutil.Process, **extra: str) -> Path:
    record = {
        "recipe": recipe,
        "runtime": "native",
        "recipe_hash": "0" * 64,
        "base_url": "http://127.0.0.1:1",
        "port": 1,
        "served_model_name": recipe,
        "started_at": time.time(),
        "pid": proc.pid,
        "extra": {
            "create_time": repr(proc.create_time()),
            "pgid": str(os.getpgid(proc.pid)),
            "argv": shlex.join(proc.cmdline()),
            **extra,
        },
    }
    path = tmp_path / "state" / "servers" / f"{recipe}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize("marker", [None, "0123456789abcdef:forged"])
def test_a_forged_record_gets_no_process_signalled(
    tmp_path: Path, victim: list[psutil.Process], marker: str | None
) -> None:
    """The hole: down trusted pid + pgid + start time from the file and killed the whole tree."""
    _forge(tmp_path, "forged", victim[0], **({"marker": marker} if marker else {"argv": "python serve"}))
    res = run_sparkctl(tmp_path, "down", "forged", "--timeout", "2")
    assert res.returncode == 0, res.stderr
    assert "nothing of it was running" in res.stdout, res.stdout
    time.sleep(0.3)
    assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in victim)
    assert not (tmp_path / "state" / "servers" / "forged.json").exists()  # the claim is set aside


def test_a_record_naming_down_s_own_ancestor_or_pid_1_signals_nothing(tmp_path: Path) -> None:
    me = psutil.Process()
    _forge(tmp_path, "mine", me, marker="")  # even with argv and start time that match exactly
    init = psutil.Process(1)
    _forge(tmp_path, "init", init, marker="")
    res = run_sparkctl(tmp_path, "down", "--all", "--timeout", "2")
    assert res.returncode == 0, res.stderr  # this test (the ancestor of `down`) is still here to see it
    assert init.is_running()
