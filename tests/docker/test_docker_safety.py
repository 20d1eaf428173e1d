"""Issue 27 on the docker runtime: `up --persist` gives the container restart policy unless-stopped (the
daemon brings it back after a reboot or a crash; `down` removes it with its policy), and an API key
reaches the container from its env file only."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from dockerkit import REPO, free_port, host_python, make_plan, wait_for
from sparkctl_proc import sparkctl_env as _env

from sparkctl.runtimes.docker import DockerRuntime

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("test_image", "no_leaks")]


def test_a_persisted_container_restarts_after_it_dies_and_stop_removes_it(tmp_path) -> None:
    runtime = DockerRuntime()
    port = free_port()
    plan = make_plan(
        "persist",
        [host_python(), "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        port=port,
        restart_policy="unless-stopped",
    )
    state = runtime.start(plan, tmp_path / "persist.log")
    try:
        c = runtime.client.containers.get(state.container_id)
        assert c.attrs["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
        wait_for(lambda: runtime.is_running(state), what="the container")
        c.reload()
        os.kill(
            c.attrs["State"]["Pid"], signal.SIGKILL
        )  # a crash (not a `docker stop`): the daemon restarts it
        wait_for(
            lambda: runtime.client.containers.get(state.container_id).attrs["RestartCount"] >= 1,
            what="a restart",
        )
        wait_for(lambda: runtime.is_running(state), what="the restarted container")
    finally:
        runtime.stop(state, timeout_s=5)
    assert runtime.client.containers.list(all=True, filters={"id": state.container_id}) == []


def test_the_api_key_reaches_the_container_from_its_env_file_only(tmp_path) -> None:
    """The key is in the container's environment (what the engine reads), not its command, labels or state."""
    import dataclasses
    import json

    key = "sk-docker-planted-" + "K" * 20
    env_file = tmp_path / "keys" / "keyed.env"
    env_file.parent.mkdir()
    env_file.write_text(f"VLLM_API_KEY={key}\n")
    runtime = DockerRuntime()
    port = free_port()
    plan = make_plan(
        "keyed", [host_python(), "-m", "http.server", str(port), "--bind", "127.0.0.1"], port=port
    )
    plan = dataclasses.replace(plan, api_key_file=str(env_file))
    state = runtime.start(plan, tmp_path / "keyed.log")
    try:
        c = runtime.client.containers.get(state.container_id)
        env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
        assert env["VLLM_API_KEY"] == key
        assert key not in json.dumps(c.attrs["Config"]["Cmd"]) + json.dumps(c.attrs["Config"]["Entrypoint"])
        assert key not in json.dumps(c.labels) and key not in json.dumps(state.to_json())
        assert state.extra["api_key_file"] == str(env_file)
    finally:
        runtime.stop(state, timeout_s=5)


# -- the Docker daemon stopped in the middle of an `up` ------------------------------------------------


def _start_daemon(root: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A second dockerd for one test (its own data root, socket and containerd; no iptables, no bridge),
    so stopping it touches nobody else's containers."""
    sock = root / "d.sock"
    with open(root / "dockerd.log", "ab") as log:
        proc = subprocess.Popen(
            [shutil.which("dockerd") or "dockerd", "--data-root", str(root / "data"), "--exec-root",
             str(root / "x"), "--pidfile", str(root / "d.pid"), "-H", f"unix://{sock}", "--iptables=false",
             "--ip6tables=false", "--bridge=none", "--shutdown-timeout=2"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    host = f"unix://{sock}"
    deadline = time.monotonic() + 60
    while subprocess.run(["docker", "-H", host, "version"], capture_output=True).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.skip(f"the private dockerd did not start: {(root / 'dockerd.log').read_text()[-500:]}")
        time.sleep(0.3)
    return host, proc


def _end_private(root: Path) -> None:
    """Kill what the private daemons started, by pid: dockerd, its containerd and any shim (their argv
    names this test's directory), then lazily unmount what they left mounted there."""
    mine = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(root) in cmd and any(n in cmd for n in ("dockerd", "containerd")):
            mine.append(p)
    for p in mine:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(mine, timeout=10)
    with open("/proc/mounts") as fh:
        points = [line.split()[1] for line in fh if line.split()[1].startswith(str(root) + "/")]
    for point in sorted(points, key=len, reverse=True):  # the netns bind mount, overlay layers...
        subprocess.run(["umount", "-l", point], capture_output=True)


@pytest.fixture
def private_daemon(test_image: str) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip("a private Docker daemon needs dockerd and root")
    root = Path(tempfile.mkdtemp(prefix="sdd", dir="/tmp"))  # short: containerd's sockets live under it
    try:
        host, proc = _start_daemon(root)
        save = subprocess.Popen(["docker", "save", test_image], stdout=subprocess.PIPE)
        load = subprocess.run(["docker", "-H", host, "load"], stdin=save.stdout, capture_output=True)
        save.wait(timeout=120)
        assert load.returncode == 0 and save.returncode == 0, load.stderr
        yield host, proc, root
    finally:
        _end_private(root)
        shutil.rmtree(root, ignore_errors=True)


def _marked(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_the_daemon_gone_while_up_waits_is_one_line_and_down_finishes_the_job(
    tmp_path: Path, private_daemon: tuple[str, subprocess.Popen[bytes], Path], how: str
) -> None:
    """`systemctl stop docker` (SIGTERM: the daemon stops the container, then exits) or a crash (SIGKILL:
    the container lives on in its shim) while `up` waits for health: one error line, exit 1, and a warning
    that the container could not be removed, so its state file stays. After the stop, the daemon is
    started again and `down` removes container and state; after the crash, `down` with no daemon is one
    line and keeps the state (the private daemon does not come back over a live shim here)."""
    host, daemon, root = private_daemon
    marker = f"dd{os.getpid()}x{time.monotonic_ns()}"
    engine = [host_python(), str(REPO / "tests" / "safety" / "fake_engine.py"), "--slow-start", "600", marker]
    mounts = ", ".join(
        f"{{source: '{p}', target: '{p}', read_only: true}}"
        for p in dict.fromkeys([sys.base_prefix, str(REPO)])
    )
    env = {
        **os.environ,
        "DOCKER_HOST": host,
        "SPARKCTL_STATE_DIR": str(tmp_path / "state"),
        "SPARKCTL_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONUNBUFFERED": "1",
    }
    up = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "up", str(REPO / "tests" / "docker" / "tiny-docker.yaml"),
         "--set", f"serve.port={free_port()}", "--set", f"engine.entrypoint={json.dumps(engine)}",
         "--set", f"container.mounts=[{mounts}]", "--set", "container.name=sparkctl-dd-test"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    assert up.stderr is not None
    seen = []
    try:
        for line in up.stderr:
            seen.append(line)
            if line.startswith("✓ launch"):
                daemon.send_signal(signal.SIGTERM if how == "stopped" else signal.SIGKILL)
                break
        seen += up.stderr.readlines()
        up.wait(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    err = "".join(seen)
    assert any(line.startswith("✓ launch") for line in seen), err
    assert up.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    state = tmp_path / "state" / "servers" / "tiny-docker.json"
    if how == "stopped":
        # the daemon stops the container, then exits: the health gate's poll lands on either side of the exit
        # (a race of the daemon's, seen in a clean-clone run), and each is the one true line of its moment
        assert (
            "container exited with code 143 (SIGTERM: `docker stop`, or the Docker daemon stopping)"
            in errors[0]
            or f"Docker daemon not reachable at {host}" in errors[0]
        ), err
    else:
        assert f"Docker daemon not reachable at {host}" in errors[0], err
    # the daemon is gone before the container could be removed: its state stays for `down`
    assert "could not stop container sparkctl-dd-test" in err and "its state is kept" in err, err
    assert state.exists()
    daemon.wait(timeout=60)
    if how == "killed":
        # its shim still runs the engine (docker's design) and no daemon answers: `down` says so in one
        # line and keeps the state for a later `down` (a restart of this private daemon over a live shim
        # does not come up here, so the fixture ends the shim and engine by pid)
        down = subprocess.run(
            [sys.executable, "-m", "sparkctl", "down", "tiny-docker"], env=env, capture_output=True,
            text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
        assert down.returncode == 1 and "Traceback" not in down.stderr, down.stderr
        assert f"Docker daemon not reachable at {host}" in down.stderr and state.exists(), down.stderr
        for pid in _marked(marker):  # the container's init and engine, ours: a reboot would end them
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return
    _start_daemon(root)  # the daemon is back
    down = subprocess.run(
        [sys.executable, "-m", "sparkctl", "down", "tiny-docker"], env=env, capture_output=True, text=True,
        cwd=REPO, timeout=120,
    )  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert not state.exists()
    left = subprocess.run(["docker", "-H", host, "ps", "-aq"], capture_output=True, text=True).stdout
    assert left.strip() == ""
    deadline = time.monotonic() + 15
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marked(marker) == []


# -- the lock and a dead server with the docker runtime (the main daemon, the fake engine) ---------------


def _docker_up_argv(port: int, *engine_args: str) -> list[str]:
    engine = [host_python(), str(REPO / "tests" / "safety" / "fake_engine.py"), *engine_args]
    mounts = ", ".join(
        f"{{source: '{p}', target: '{p}', read_only: true}}"
        for p in dict.fromkeys([sys.base_prefix, str(REPO)])
    )
    return [sys.executable, "-m", "sparkctl", "up", str(REPO / "tests" / "docker" / "tiny-docker.yaml"),
            "--set", f"serve.port={port}", "--set", f"engine.entrypoint={json.dumps(engine)}",
            "--set", f"container.mounts=[{mounts}]"]  # fmt: skip


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkctl", *args], env=_env(tmp_path), capture_output=True, text=True,
        cwd=REPO, timeout=120,
    )  # fmt: skip


def test_down_while_a_docker_up_waits_for_health_stops_its_container(tmp_path: Path, docker_client) -> None:
    marker = f"dl{os.getpid()}x{time.monotonic_ns()}"
    up = subprocess.Popen(
        _docker_up_argv(free_port(), "--slow-start", "600", marker), env=_env(tmp_path),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    assert up.stderr is not None
    try:
        seen = []
        for line in up.stderr:
            seen.append(line)
            if line.startswith("✓ launch"):
                break
        down = _cli(tmp_path, "down", "tiny-docker")
        seen += up.stderr.readlines()
        up.wait(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    err = "".join(seen)
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith("stopped tiny-docker (it was still starting: interrupted its `up` (pid "), (
        err
    )
    assert up.returncode == 130 and "Traceback" not in err, err
    assert not (tmp_path / "state" / "servers" / "tiny-docker.json").exists()
    assert docker_client.containers.list(all=True, filters={"name": "sparkctl-tiny-docker"}) == []
    assert _marked(marker) == []


def test_a_docker_server_whose_process_died_is_stopped_and_the_next_up_cleans_it(
    tmp_path: Path, docker_client
) -> None:
    """The engine inside the container killed (OOM, a crash): the container ends with it, so `status` says
    stopped (docker leaves no orphaned engine core behind: the container's processes go with it), and
    the next `up` removes the dead container and starts again."""
    port = free_port()
    up = subprocess.run(_docker_up_argv(port), env=_env(tmp_path), capture_output=True, text=True, cwd=REPO,
                        timeout=180)  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        c = docker_client.containers.get("sparkctl-tiny-docker")
        (engine,) = psutil.Process(c.attrs["State"]["Pid"]).children()  # docker-init's child: the server
        engine.kill()
        wait_for(lambda: docker_client.containers.get(c.id).status != "running", what="the container to end")
        status = json.loads(_cli(tmp_path, "status", "tiny-docker", "--json").stdout)
        assert [r["health"] for r in status] == ["stopped"], status
        again = subprocess.run(_docker_up_argv(port), env=_env(tmp_path), capture_output=True, text=True,
                               cwd=REPO, timeout=180)  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert "tiny-docker had a state file but was not running (cleaned up)" in " ".join(
            again.stderr.split()
        )
        assert docker_client.containers.get("sparkctl-tiny-docker").id != c.id
    finally:
        _cli(tmp_path, "down", "tiny-docker")
    assert docker_client.containers.list(all=True, filters={"name": "sparkctl-tiny-docker"}) == []


@pytest.mark.parametrize("after", ["doctor", "image", "launch"])
def test_ctrl_c_in_a_docker_up_exits_130_and_leaves_no_container(
    tmp_path: Path, docker_client, after: str
) -> None:
    """SIGINT once a stage's line is out: after `doctor` it lands in the image check (or the fetch just
    after it), after `launch` in the health wait. No container, no state, no engine process."""
    from ctrl_c import sigint_default

    marker = f"dc{os.getpid()}x{time.monotonic_ns()}"
    up = subprocess.Popen(
        _docker_up_argv(free_port(), "--slow-start", "600", marker), env=_env(tmp_path),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, preexec_fn=sigint_default,
    )  # fmt: skip
    assert up.stderr is not None
    seen = []
    try:
        for line in up.stderr:
            seen.append(line)
            if line.startswith(f"✓ {after} "):
                up.send_signal(signal.SIGINT)
                break
        seen += up.stderr.readlines()
        up.wait(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    err = "".join(seen)
    assert up.returncode in (130, -signal.SIGINT), err  # see tests/safety/test_ctrl_c_stages.py
    assert "interrupted: stopped what this `up` had started" in err and "Traceback" not in err, err
    assert not (tmp_path / "state" / "servers" / "tiny-docker.json").exists()
    assert docker_client.containers.list(all=True, filters={"name": "sparkctl-tiny-docker"}) == []
    assert _marked(marker) == []
