"""`sparkctl up/status/logs/down` with the docker runtime, end to end: a real Docker engine, the locally
built test image, the real vLLM CPU build serving the tiny generated Llama inside it.

One server for the whole module (started once: ~40 s on 2 cores); `down` is the last test that uses
it. The failure paths each start from nothing and must leave nothing: no container, no host process,
no state file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import httpx
import psutil
import pytest
from ctrl_c import sigint_default
from dockerkit import REPO, free_port, managed_container_ids

from sparkctl.runtimes.docker import LABEL_RECIPE, LABEL_RECIPE_HASH

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.vllm]

RECIPE_YAML = Path(__file__).with_name("tiny-docker.yaml")
SERVER = "tiny-docker"


def vllm_installed() -> bool:
    return (
        (Path(sys.prefix) / ".vllm-installed").exists() or shutil.which("vllm") is not None or _importable()
    )


def _importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def host_overrides() -> list[str]:
    """Where the interpreter and vLLM live on this machine: mounted read-only at the same paths."""
    mounts = []
    for p in dict.fromkeys([sys.base_prefix, str(REPO), sys.prefix]):
        if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in (sys.base_prefix, str(REPO))):
            mounts.append(f"{{source: '{p}', target: '{p}', read_only: true}}")
    python = Path(sys.prefix) / "bin" / "python"
    return [
        "--set",
        f"engine.entrypoint=['{python}', '-m', 'vllm.entrypoints.openai.api_server']",
        "--set",
        f"container.mounts=[{', '.join(mounts)}]",
    ]


@dataclass
class Env:
    root: Path
    env: dict[str, str]

    def sparkctl(self, *args: str, timeout: float = 120, extra_env: dict[str, str] | None = None):
        env = {**self.env, **(extra_env or {})}
        return subprocess.run(
            [sys.executable, "-m", "sparkctl", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=timeout,
        )

    def state_files(self) -> list[Path]:
        d = self.root / "state" / "servers"
        return sorted(d.glob("*.json")) if d.exists() else []

    def recipe(self, name: str) -> str:
        """A copy of the test recipe under another name: each failure path gets its own recipe."""
        path = self.root / "recipes" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(RECIPE_YAML, path)
        return str(path)


@pytest.fixture(scope="session")
def e2e_env(tmp_path_factory, test_image) -> Env:
    if not vllm_installed():
        pytest.skip("vLLM CPU build not installed (make install-vllm)")
    root = tmp_path_factory.mktemp("docker-e2e")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SPARKCTL_", "DOCKER_HOST", "HF_", "VLLM_"))
    }
    env.update(
        SPARKCTL_STATE_DIR=str(root / "state"),
        SPARKCTL_CACHE_DIR=str(root / "cache"),
        NO_COLOR="1",
        COLUMNS="200",
    )
    return Env(root=root, env=env)


@dataclass
class Server:
    port: int
    up: subprocess.CompletedProcess
    seconds: float


@pytest.fixture(scope="session")
def server(e2e_env: Env, docker_client) -> Iterator[Server]:
    port = free_port()
    t0 = time.monotonic()
    up = e2e_env.sparkctl(
        "up", str(RECIPE_YAML), *host_overrides(), "--set", f"serve.port={port}", timeout=420
    )
    seconds = time.monotonic() - t0
    if up.returncode != 0:
        pytest.fail(f"sparkctl up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    try:
        yield Server(port=port, up=up, seconds=seconds)
    finally:  # if `test_down` did not run (or failed), still leave nothing behind
        if e2e_env.state_files():
            e2e_env.sparkctl("down", SERVER, timeout=60)


def our_containers(docker_client) -> list:
    found = []
    for c in managed_container_ids(docker_client):
        try:
            found.append(docker_client.containers.get(c))
        except docker.errors.NotFound:  # removed (--rm) between the listing and the look-up
            continue
    return found


def processes_serving(name: str) -> list[int]:
    """Host processes (containers' included: same kernel) started for the recipe `name`."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "--served-model-name" in cmd and name in cmd:
            pids.append(proc.info["pid"])
    return pids


def assert_nothing_left(e2e_env: Env, docker_client, name: str) -> None:
    deadline = (
        time.monotonic() + 30
    )  # a stopped --rm container is removed by the engine a moment later (under load)
    while [
        c for c in our_containers(docker_client) if c.labels.get(LABEL_RECIPE) == name
    ] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [c.name for c in our_containers(docker_client) if c.labels.get(LABEL_RECIPE) == name]
    assert not [p for p in e2e_env.state_files() if p.stem == name]
    deadline = time.monotonic() + 10  # an exiting process may take a moment to be reaped
    while processes_serving(name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_serving(name)


# -- the shared server: up -> health -> status -> logs -> down ---------------------------------------


def test_up_brings_a_healthy_container(server: Server, docker_client, e2e_env: Env) -> None:
    base = f"http://127.0.0.1:{server.port}"
    assert f"{base}" in server.up.stdout + server.up.stderr
    assert httpx.get(f"{base}/health", timeout=5).status_code == 200
    models = httpx.get(f"{base}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["tiny-docker"]
    (container,) = [c for c in our_containers(docker_client) if c.labels.get(LABEL_RECIPE) == SERVER]
    assert container.name == "sparkctl-tiny-docker" and container.status == "running"
    (state,) = e2e_env.state_files()
    saved = json.loads(state.read_text())
    assert saved["runtime"] == "docker" and saved["container_id"] == container.id
    assert container.labels[LABEL_RECIPE_HASH] == saved["recipe_hash"]
    assert container.attrs["HostConfig"]["NetworkMode"] == "host"
    print(f"\n[docker e2e] sparkctl up -> healthy + smoke in {server.seconds:.1f}s")


def test_chat_completion_streams(server: Server) -> None:
    body = {
        "model": "tiny-docker",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8,
        "stream": True,
    }
    chunks = []
    with httpx.stream(
        "POST", f"http://127.0.0.1:{server.port}/v1/chat/completions", json=body, timeout=60
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert len(chunks) >= 2 and chunks[0]["model"] == "tiny-docker"


def test_status_reports_the_container(server: Server, e2e_env: Env) -> None:
    proc = e2e_env.sparkctl("status", "--json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["recipe"] == SERVER and row["runtime"] == "docker" and row["port"] == server.port
    assert row["health"] == "healthy" and row["container"] == "sparkctl-tiny-docker"
    assert row["memory_bytes"] and row["memory_bytes"] > 50 * 2**20  # vLLM with torch loaded
    table = e2e_env.sparkctl("status")
    assert "tiny-docker" in table.stdout and "healthy" in table.stdout


def test_logs_show_the_server_output(server: Server, e2e_env: Env) -> None:
    proc = e2e_env.sparkctl("logs", SERVER)
    assert proc.returncode == 0, proc.stderr
    assert "Application startup complete" in proc.stdout
    tail = e2e_env.sparkctl("logs", SERVER, "--tail", "3")
    assert len(tail.stdout.splitlines()) == 3


def test_logs_follow_streams_new_lines(server: Server, e2e_env: Env) -> None:
    follower = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "logs", SERVER, "-f", "--tail", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=e2e_env.env,
        cwd=REPO,
        preexec_fn=sigint_default,
    )
    try:
        time.sleep(2)
        httpx.get(f"http://127.0.0.1:{server.port}/v1/models?marker=c2follow", timeout=5)
        deadline = time.monotonic() + 20
        seen = ""
        while time.monotonic() < deadline and "GET /v1/models" not in seen:
            seen += follower.stdout.readline()
        assert "GET /v1/models" in seen
    finally:
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=10)


def test_image_healthcheck_script_passes_inside(server: Server, docker_client) -> None:
    """docker/healthcheck.py, the Spark image's HEALTHCHECK, run in the live container: SPARKCTL_PORT is
    set by the runtime and the script reaches /health over the host network."""
    container = docker_client.containers.get("sparkctl-tiny-docker")
    code, out = container.exec_run(
        [sys.base_prefix + "/bin/python3", str(REPO / "docker" / "healthcheck.py")]
    )
    assert code == 0 and out.decode().startswith(f"healthy: http://127.0.0.1:{server.port}/health")


def test_up_again_reports_the_running_server(server: Server, e2e_env: Env, docker_client) -> None:
    before = managed_container_ids(docker_client)
    again = e2e_env.sparkctl(
        "up", str(RECIPE_YAML), *host_overrides(), "--set", f"serve.port={server.port}", timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert "already" in (again.stdout + again.stderr).lower()
    assert managed_container_ids(docker_client) == before


def test_port_taken_by_our_server(server: Server, e2e_env: Env, docker_client) -> None:
    other = e2e_env.recipe("tiny-docker-port")
    proc = e2e_env.sparkctl("up", other, *host_overrides(), "--set", f"serve.port={server.port}")
    assert proc.returncode == 2
    assert (
        f"error: port {server.port} is taken by recipe tiny-docker (container sparkctl-tiny-docker)"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert_nothing_left(e2e_env, docker_client, "tiny-docker-port")


def test_daemon_unreachable_while_serving(server: Server, e2e_env: Env, tmp_path) -> None:
    """With DOCKER_HOST pointing at a dead socket, `status` reports the error in its row and `down`
    refuses (exit 1, state kept): the container may well still be running on the real daemon."""
    dead = {"DOCKER_HOST": f"unix://{tmp_path}/dead.sock"}
    status = e2e_env.sparkctl("status", "--json", extra_env=dead)
    assert status.returncode == 0, status.stderr
    (row,) = json.loads(status.stdout)
    assert row["error"] == f"Docker daemon not reachable at unix://{tmp_path}/dead.sock"
    down = e2e_env.sparkctl("down", SERVER, extra_env=dead)
    assert down.returncode == 1 and "error: Docker daemon not reachable at" in down.stderr
    assert "Traceback" not in down.stderr
    assert [p.stem for p in e2e_env.state_files()] == [SERVER]
    assert httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5).status_code == 200


def test_down_removes_everything(server: Server, e2e_env: Env, docker_client) -> None:
    proc = e2e_env.sparkctl("down", SERVER, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "stopped tiny-docker" in proc.stdout
    assert_nothing_left(e2e_env, docker_client, SERVER)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=2)
    # the log outlives the container
    logs = e2e_env.sparkctl("logs", SERVER)
    assert logs.returncode == 0 and "Application startup complete" in logs.stdout
    # and down is idempotent
    again = e2e_env.sparkctl("down", SERVER)
    assert again.returncode == 0 and "not running" in again.stdout


# -- failure paths: each one clear line, and nothing left behind ---------------------------------------


def test_daemon_not_running(e2e_env: Env, docker_client, tmp_path) -> None:
    dead = f"unix://{tmp_path}/no-daemon.sock"
    proc = e2e_env.sparkctl(
        "up", e2e_env.recipe("tiny-docker-nodaemon"), *host_overrides(), "--set", f"serve.port={free_port()}",
        extra_env={"DOCKER_HOST": dead},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    # the doctor's docker check (or, without it, the runtime's own check) names the dead address
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and dead in errors[0], proc.stderr
    assert "reachable" in errors[0] or "unreachable" in errors[0]
    assert "systemctl start docker" in proc.stderr
    assert_nothing_left(e2e_env, docker_client, "tiny-docker-nodaemon")


def test_image_missing(e2e_env: Env, docker_client) -> None:
    proc = e2e_env.sparkctl(
        "up", e2e_env.recipe("tiny-docker-noimage"), *host_overrides(),
        "--set", f"serve.port={free_port()}", "--set", "container.image=sparkctl-test:missing",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error: Docker image sparkctl-test:missing not found locally" in proc.stderr
    assert "hint: build it: make test-image" in proc.stderr
    assert_nothing_left(e2e_env, docker_client, "tiny-docker-noimage")


def test_port_taken_by_another_process(e2e_env: Env, docker_client) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc = e2e_env.sparkctl(
            "up", e2e_env.recipe("tiny-docker-squat"), *host_overrides(), "--set", f"serve.port={port}"
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: port {port} on 127.0.0.1 is already in use" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert_nothing_left(e2e_env, docker_client, "tiny-docker-squat")


def test_container_exits_early(e2e_env: Env, docker_client) -> None:
    proc = e2e_env.sparkctl(
        "up", e2e_env.recipe("tiny-docker-badflag"), *host_overrides(),
        "--set", f"serve.port={free_port()}", "--set", "serve.extra_args=[--no-such-flag]",
        timeout=240,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "error: tiny-docker-badflag stopped during start-up" in proc.stderr, out
    assert "container exited with code 2" in proc.stderr, out
    assert "unrecognized arguments: --no-such-flag" in out  # vLLM's own words, from the last log lines
    assert "Traceback (most recent call last)" not in proc.stderr.split("error:")[-1]
    assert_nothing_left(e2e_env, docker_client, "tiny-docker-badflag")
    # the container is gone, its log is not
    logs = e2e_env.sparkctl("logs", "tiny-docker-badflag")
    assert logs.returncode == 0 and "unrecognized arguments: --no-such-flag" in logs.stdout


def test_health_timeout(e2e_env: Env, docker_client) -> None:
    proc = e2e_env.sparkctl(
        "up", e2e_env.recipe("tiny-docker-slow"), *host_overrides(),
        "--set", f"serve.port={free_port()}", "--set", "serve.health_timeout_s=4",
        timeout=240,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "error: tiny-docker-slow was not healthy within 4s" in proc.stderr, out
    assert "health_timeout_s" in proc.stderr  # the hint says what to raise
    assert_nothing_left(e2e_env, docker_client, "tiny-docker-slow")


def test_ctrl_c_during_start_up_stops_the_container(e2e_env: Env, docker_client) -> None:
    name = "tiny-docker-interrupt"
    up = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "up", e2e_env.recipe(name), *host_overrides(),
         "--set", f"serve.port={free_port()}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e2e_env.env, cwd=REPO,
        preexec_fn=sigint_default,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not [
            c for c in our_containers(docker_client) if c.labels.get(LABEL_RECIPE) == name
        ]:
            assert up.poll() is None, up.communicate()
            time.sleep(0.2)
        assert time.monotonic() < deadline, "the container never appeared"
        time.sleep(1)  # well inside vLLM's start-up
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    try:
        assert up.returncode == 130, err
        assert "Traceback" not in err
        assert_nothing_left(e2e_env, docker_client, name)
    finally:
        # whatever went wrong, no vLLM may keep running in a container after this test: a leftover one slowed
        # every later test on the machine, and the next run's `up` of this recipe refused to start
        for c in our_containers(docker_client):
            if c.labels.get(LABEL_RECIPE) == name:
                c.remove(force=True)
