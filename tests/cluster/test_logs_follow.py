"""`sparkctl logs --follow` for a cluster launch: a part on this machine and one on "the worker" (a real
sshd on 127.0.0.2), each a real process writing its log; new lines of both arrive prefixed with their
node, the follow ends when the launch's state file goes (`down`), and no follower stays on either node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest
from ctrl_c import sigint_default
from sshd import Sshd, sshd_missing, start_sshd

from sparkctl.cluster.nodes import Node, parse_node
from sparkctl.runtimes import cluster as cluster_run
from sparkctl.runtimes import state as state_files
from sparkctl.runtimes.base import ServerState

REPO = Path(__file__).resolve().parents[2]
ADDRESS = "127.0.0.2"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(sshd_missing()), reason=sshd_missing() or "")]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"), address=ADDRESS)
    yield server
    server.stop()


def _followers(log: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(str(log) in part for part in cmd) and any("tail" in part for part in cmd):
            out.append(p)
    return out


def _state(nodes: list[dict], parts: list[cluster_run.Started]) -> ServerState:
    """A cluster server's state as `up --nodes` records it: the nodes and each part started there."""
    return ServerState(
        recipe="tiny-2x",
        runtime="cluster",
        recipe_hash="0" * 64,
        base_url="http://127.0.0.1:1",
        port=1,
        served_model_name="tiny",
        started_at=time.time(),
        extra={"executor": "mp", "node_runtime": "native"},
        nodes=nodes,
        parts=[asdict(p) for p in parts],
    )


def test_follow_spans_both_nodes(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", sshd.opts())
    w = parse_node(f"root@{ADDRESS}:{sshd.port}")
    head = Node("localhost", "localhost")
    logs = {head.address: tmp_path / "head.log", w.address: tmp_path / "worker.log"}
    for log in logs.values():
        log.write_text("old line\n")
    state = _state(
        [asdict(head), asdict(w)],
        [
            cluster_run.Started(
                head.address, "process", str(os.getpid()), "server", log=str(logs[head.address])
            ),
            cluster_run.Started(
                w.address, "process", str(os.getpid()), "headless rank", log=str(logs[w.address])
            ),
        ],
    )
    state_files.save(state)
    got: list[str] = []
    done = threading.Event()

    def follow() -> None:
        for line in cluster_run.follow_lines(state, tail=1):
            got.append(line)
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    deadline = time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(got) == [f"[{head.address}] old line", f"[{w.address}] old line"]
    for node, log in logs.items():
        with log.open("a") as f:
            f.write(f"new from {node}\n")
    while len(got) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"[{w.address}] new from {w.address}" in got and f"[{head.address}] new from {head.address}" in got
    state_files.state_path("tiny-2x").unlink()  # what `down` does last
    assert done.wait(10)
    time.sleep(0.5)
    assert _followers(logs[w.address]) == [] and _followers(logs[head.address]) == []


def test_cli_follow_ends_with_down(sshd: Sshd, tmp_path: Path) -> None:
    """`sparkctl logs RECIPE -f` as a process: prints the prefixed lines, exits 0 once the state goes."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}", "SPARKCTL_SSH_OPTS": sshd.opts()}
    w = parse_node(f"root@{ADDRESS}:{sshd.port}")
    log = tmp_path / "w.log"
    log.write_text("hello from the worker\n")
    state = _state(
        [asdict(Node("localhost", "localhost")), asdict(w)],
        [cluster_run.Started(w.address, "process", str(os.getpid()), "headless rank", log=str(log))],
    )
    state_files.save(state)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "logs", "tiny-2x", "-f"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == f"[{w.address}] hello from the worker"
    state_files.state_path("tiny-2x").unlink()
    assert proc.wait(timeout=15) == 0
    assert _followers(log) == []
    state_files.save(state)
    interrupted = subprocess.Popen(  # Ctrl-C (SIGINT to the whole group) ends the follow and its followers
        [sys.executable, "-m", "sparkctl", "logs", "tiny-2x", "-f"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=sigint_default,
    )
    assert interrupted.stdout is not None
    assert interrupted.stdout.readline().strip() == f"[{w.address}] hello from the worker"
    os.killpg(interrupted.pid, signal.SIGINT)
    assert interrupted.wait(timeout=15) == 0
    time.sleep(0.5)
    assert _followers(log) == []
