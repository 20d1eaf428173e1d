"""The native runtime against real processes: a python "server" that forks a worker, like vLLM does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from procs import gone

from sparkctl.errors import RuntimeFailure
from sparkctl.runtimes.native import NativeRuntime, follow_file, tail_lines

# The leader forks a worker that stays in its process group, then both sleep; the worker's pid is
# printed so the test can check it dies with the leader.
SERVER_WITH_WORKER = """
import os, subprocess, sys, time
w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
print('leader', os.getpid(), 'worker', w.pid, flush=True)
print('env', os.environ.get('SPARKCTL_TEST_ENV'), flush=True)
time.sleep(600)
"""

# Ignores SIGTERM: only the SIGKILL after the grace period stops it.
STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('ready', flush=True)
time.sleep(600)
"""


def _wait_for(pred, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _log_line(path: Path, prefix: str) -> str:
    # Only whole lines: a poll can land between the writes of one print (seen in a loaded CI run).
    def find():
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        for line in text.split("\n")[:-1]:
            if line.startswith(prefix):
                return line
        return None

    return _wait_for(find)


@pytest.mark.slow
def test_start_stop_kills_the_whole_process_group(make_plan, tmp_path):
    rt = NativeRuntime()
    log = tmp_path / "logs" / "t.log"
    state = rt.start(make_plan(SERVER_WITH_WORKER, env={"SPARKCTL_TEST_ENV": "from-plan"}), log)
    try:
        line = _log_line(log, "leader")
        leader_pid, worker_pid = int(line.split()[1]), int(line.split()[3])
        assert leader_pid == state.pid
        assert os.getpgid(worker_pid) == state.pid  # the worker lives in the server's own group
        assert os.getpgid(state.pid) != os.getpgid(0)  # ... which is not ours (Ctrl-C does not reach it)
        assert rt.is_running(state)
        assert "env from-plan" in tail_lines(log, 10)
        stats = rt.stats(state)
        assert stats["processes"] == 2
        assert stats["memory_bytes"] > 1_000_000  # two python interpreters
        assert rt.exit_code(state) is None
        assert rt.exit_detail(state) is None
    finally:
        rt.stop(state, timeout_s=10)
    assert not rt.is_running(state)
    assert gone(worker_pid)
    assert rt.exit_code(state) == -signal.SIGTERM
    assert rt.exit_detail(state) == "process was killed by SIGTERM"
    rt.stop(state)  # idempotent: stopping a gone server is not an error
    assert rt.stats(state) is None


@pytest.mark.slow
def test_log_starts_with_the_command_line(make_plan, tmp_path):
    rt = NativeRuntime()
    log = tmp_path / "t.log"
    state = rt.start(make_plan("print('hello from server', flush=True)"), log)
    _wait_for(lambda: rt.exit_code(state) is not None)
    lines = tail_lines(log, 10)
    assert lines[0].startswith("# sparkctl: starting t: ")
    assert sys.executable in lines[0]
    assert "hello from server" in lines
    assert rt.exit_code(state) == 0
    assert not rt.is_running(state)


@pytest.mark.slow
def test_sigterm_ignored_escalates_to_sigkill(make_plan, tmp_path):
    rt = NativeRuntime()
    log = tmp_path / "t.log"
    state = rt.start(make_plan(STUBBORN), log)
    _log_line(log, "ready")
    t0 = time.monotonic()
    rt.stop(state, timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert not rt.is_running(state)
    assert rt.exit_code(state) == -signal.SIGKILL
    assert "SIGKILL" in rt.exit_detail(state)
    assert 0.9 <= elapsed < 10


@pytest.mark.slow
def test_early_exit_reports_exit_code(make_plan, tmp_path):
    rt = NativeRuntime()
    state = rt.start(make_plan("import sys; print('boom', flush=True); sys.exit(3)"), tmp_path / "t.log")
    _wait_for(lambda: rt.exit_code(state) is not None)
    assert rt.exit_code(state) == 3
    assert rt.exit_detail(state) == "process exited with code 3"
    assert not rt.is_running(state)
    assert NativeRuntime().exit_detail(state) == "the server process is gone"  # not our child: no code


@pytest.mark.slow
def test_reused_pid_is_not_ours(make_plan, tmp_path):
    """A state file whose pid now belongs to another process: not running, and stop leaves it alone."""
    rt = NativeRuntime()
    state = rt.start(make_plan("import time; time.sleep(600)"), tmp_path / "t.log")
    time.sleep(0.05)  # start times have 10 ms ticks: make sure the two differ, as a reused pid's would
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        forged = type(state)(**{**state.to_json(), "pid": bystander.pid})
        # the start time stays the server's; the marker is another server's (the real one's would prove
        # that one, which stop() may then stop: it is ours)
        forged.extra = {**state.extra, "pgid": str(bystander.pid), "marker": "0:t"}
        time.sleep(0.1)
        assert not rt.is_running(forged)
        assert rt.stats(forged) is None
        rt.stop(forged, timeout_s=1)
        assert bystander.poll() is None  # untouched
    finally:
        bystander.kill()
        bystander.wait()
        rt.stop(state, timeout_s=5)


def test_missing_executable_is_a_clear_error(make_plan, tmp_path):
    rt = NativeRuntime()
    with pytest.raises(RuntimeFailure, match="not found") as info:
        rt.start(make_plan(argv=["/nonexistent/vllm-server", "--port", "1"]), tmp_path / "t.log")
    assert "install" in (info.value.hint or "")


@pytest.mark.slow
def test_logs_tail_and_follow_until_exit(make_plan, tmp_path):
    rt = NativeRuntime()
    code = "import time\nfor i in range(5):\n    print('line', i, flush=True)\n    time.sleep(0.2)\n"
    state = rt.start(make_plan(code), tmp_path / "t.log")
    got = list(rt.logs(state, follow=True))  # returns by itself once the process has exited
    assert [g for g in got if g.startswith("line")] == [f"line {i}" for i in range(5)]
    assert list(rt.logs(state, tail=2)) == ["line 3", "line 4"]


def test_follow_file_missing_and_partial_lines(tmp_path):
    assert list(follow_file(tmp_path / "nope.log")) == []
    p = tmp_path / "a.log"
    p.write_text("a\nb\nc")
    assert list(follow_file(p, tail=2)) == ["b", "c"]
    assert tail_lines(p, 0) == []
    assert tail_lines(None, 5) == []


def test_follow_completes_a_line_that_was_half_written(tmp_path):
    p = tmp_path / "half.log"
    p.write_text("first\nsec")
    done = {"alive": True}
    gen = follow_file(p, follow=True, alive=lambda: done["alive"], poll_s=0.01)
    assert next(gen) == "first"
    with open(p, "a") as fh:
        fh.write("ond\nthird\n")
    done["alive"] = False
    assert list(gen) == ["second", "third"]


# Creates a POSIX shared-memory segment (as vLLM's message queues do) and ignores SIGTERM, so only SIGKILL stops it
# and nothing in it can unlink the segment.
LEAKS_SHM = """
import signal, sys, time
from multiprocessing import shared_memory
signal.signal(signal.SIGTERM, signal.SIG_IGN)
seg = shared_memory.SharedMemory(create=True, size=1 << 20)
seg.buf[:4] = b'live'
print('segment', seg.name, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_stop_unlinks_the_shared_memory_a_killed_server_leaves(make_plan, tmp_path):
    from multiprocessing import shared_memory

    bystander = shared_memory.SharedMemory(create=True, size=4096)  # someone else's: must survive
    try:
        rt = NativeRuntime()
        state = rt.start(make_plan(LEAKS_SHM), tmp_path / "t.log")
        name = _log_line(tmp_path / "t.log", "segment").split()[1]
        leaked = Path("/dev/shm") / name
        assert leaked.exists()
        rt.stop(state, timeout_s=0.5)
        assert rt.exit_code(state) == -signal.SIGKILL
        assert not leaked.exists()  # without the clean-up it stays until reboot
        assert (Path("/dev/shm") / bystander.name.lstrip("/")).exists()
    finally:
        bystander.close()
        bystander.unlink()


def test_remove_leftovers_skips_what_is_gone_or_not_removable(tmp_path):
    from sparkctl.runtimes.shm import held_segments, remove_leftovers

    there = tmp_path / "psm_there"
    there.write_bytes(b"x")
    assert remove_leftovers([tmp_path / "psm_gone", there]) == [there]
    assert not there.exists()
    # a process that maps nothing under the directory holds nothing there
    assert held_segments([psutil.Process()], shm_dir=tmp_path) == set()
