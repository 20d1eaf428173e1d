"""DockerRuntime against a real Docker engine and the local test image (no vLLM: seconds, not minutes).

Containers here run the host Python (bind-mounted read-only) as a small HTTP server or a script, so
every test exercises the real SDK path: create, start, labels, host network, logs, stop, remove.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest
from dockerkit import fake_hf_snapshot, free_port, host_python, make_plan, wait_for

from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.planner.types import ContainerSpec, Mount
from sparkctl.runtimes.docker import (
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_RECIPE_HASH,
    DockerRuntime,
    ensure_image,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("test_image", "no_leaks")]


def http_server_plan(name: str, port: int, **kw):
    return make_plan(
        name, [host_python(), "-m", "http.server", str(port), "--bind", "127.0.0.1"], port=port, **kw
    )


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def runtime() -> DockerRuntime:
    return DockerRuntime()


def test_check_passes_with_engine_and_image() -> None:
    DockerRuntime(image="sparkctl-test:cpu").check()


def test_daemon_not_running_is_one_clear_line(monkeypatch, tmp_path) -> None:
    dead = f"unix://{tmp_path}/dead.sock"
    monkeypatch.setenv("DOCKER_HOST", dead)
    with pytest.raises(RuntimeFailure) as err:
        DockerRuntime().check()
    assert str(err.value) == f"Docker daemon not reachable at {dead}"
    assert "systemctl start docker" in (err.value.hint or "")


def test_missing_image_names_it_and_says_how_to_build() -> None:
    with pytest.raises(RuntimeFailure) as err:
        DockerRuntime(image="sparkctl-test:absent").check()
    assert str(err.value) == "Docker image sparkctl-test:absent not found locally"
    assert "make test-image" in (err.value.hint or "")
    with pytest.raises(RuntimeFailure) as err:
        ensure_image("sparkctl/spark:no-such-tag", recipe="glm-5.3-flash")
    assert "sparkctl build glm-5.3-flash (or sparkctl up glm-5.3-flash --build)" in (err.value.hint or "")


def test_start_logs_stop_roundtrip(runtime, tmp_path) -> None:
    port = free_port()
    plan = http_server_plan(
        "c2-http", port, env={"SPARKCTL_TEST_ENV": "yes"}, ulimits={"nofile": (4096, 8192)}
    )
    log_path = tmp_path / "logs" / "c2-http.log"
    state = runtime.start(plan, log_path)
    try:
        assert state.runtime == "docker" and state.container_name == "sparkctl-c2-http"
        assert state.base_url == f"http://127.0.0.1:{port}" and state.recipe_hash == "hash-of-c2-http"
        wait_for(lambda: answers(state.base_url + "/"), what="the containerised http.server")
        assert runtime.is_running(state)

        c = runtime.client.containers.get(state.container_id)
        assert c.name == "sparkctl-c2-http"
        assert c.labels[LABEL_MANAGED] == "true"
        assert c.labels[LABEL_RECIPE] == "c2-http"
        assert c.labels[LABEL_RECIPE_HASH] == "hash-of-c2-http"
        host_config = c.attrs["HostConfig"]
        assert host_config["NetworkMode"] == "host" and host_config["IpcMode"] == "host"
        assert host_config["Ulimits"] == [{"Name": "nofile", "Soft": 4096, "Hard": 8192}]
        assert not host_config.get("DeviceRequests")  # gpus=False: no device request
        assert all(m["RW"] is False for m in c.attrs["Mounts"])
        env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
        assert env["SPARKCTL_TEST_ENV"] == "yes" and env["SPARKCTL_PORT"] == str(port)

        httpx.get(state.base_url + "/marker-path-c2", timeout=5)
        wait_for(
            lambda: any("/marker-path-c2" in line for line in runtime.logs(state)),
            what="the request in the log",
        )
        assert len(list(runtime.logs(state, tail=1))) == 1
    finally:
        runtime.stop(state, timeout_s=5)
    assert not runtime.is_running(state)
    assert runtime._find(state) is None  # removed, not just stopped
    assert not answers(state.base_url + "/")
    # the log outlives the container, for `sparkctl logs` after `down`
    assert "/marker-path-c2" in log_path.read_text()
    assert any("/marker-path-c2" in line for line in runtime.logs(state))
    runtime.stop(state)  # idempotent: a gone container is not an error


def test_follow_streams_until_the_container_exits(runtime, tmp_path) -> None:
    script = "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(0.3)\n"
    plan = make_plan("c2-follow", [host_python(), "-c", script], port=free_port())
    state = runtime.start(plan, tmp_path / "follow.log")
    try:
        lines = list(runtime.logs(state, follow=True))
        assert lines == ["tick 0", "tick 1", "tick 2", "tick 3"]
    finally:
        runtime.stop(state)


def test_container_that_exits_early_says_how(runtime, tmp_path) -> None:
    script = "import sys; print('bad flag --bogus', file=sys.stderr); sys.exit(3)"
    state = runtime.start(
        make_plan("c2-early", [host_python(), "-c", script], port=free_port()), tmp_path / "l"
    )
    try:
        wait_for(lambda: not runtime.is_running(state), what="the container to exit")
        assert runtime.exit_detail(state) == "container exited with code 3"
        assert "bad flag --bogus" in list(runtime.logs(state, tail=5))
    finally:
        runtime.stop(state)
    assert runtime._find(state) is None


def test_missing_entrypoint_exits_with_a_reason(runtime, tmp_path) -> None:
    """The init in the container reports an entrypoint that is not in the image; the runtime says so."""
    plan = make_plan("c2-noexec", ["/no/such/binary", "--flag"], port=free_port())
    state = runtime.start(plan, tmp_path / "l")
    try:
        wait_for(lambda: not runtime.is_running(state), what="the container to exit")
        assert runtime.exit_detail(state) == "container exited with code 127"
        assert any("/no/such/binary" in line for line in runtime.logs(state))
    finally:
        runtime.stop(state)


def test_gpu_request_reaches_the_engine(runtime, tmp_path, docker_client) -> None:
    """gpus=True becomes a device request; on a machine without the NVIDIA runtime, Docker refuses it,
    which proves the request was sent, and the half-made container must not stay behind."""
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime; the refusal path cannot be shown here")
    plan = make_plan("c2-gpu", [host_python(), "-c", "pass"], port=free_port(), gpus=True)
    with pytest.raises(RuntimeFailure) as err:
        runtime.start(plan, tmp_path / "l")
    assert "gpu" in str(err.value).lower()
    assert "NVIDIA Container Toolkit" in (err.value.hint or "")
    assert not docker_client.containers.list(all=True, filters={"name": "sparkctl-c2-gpu"})


def test_port_taken_names_the_owner(runtime, tmp_path, docker_client) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(UserError) as err:
            runtime.start(http_server_plan("c2-port", port), tmp_path / "l")
    assert str(err.value).startswith(f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()} ")
    assert "--port N" in (err.value.hint or "")
    assert not docker_client.containers.list(all=True, filters={"name": "sparkctl-c2-port"})


def test_name_in_use(runtime, tmp_path, docker_client) -> None:
    # a stopped container of ours with the same name is replaced
    first = runtime.start(
        make_plan("c2-name", [host_python(), "-c", "pass"], port=free_port()), tmp_path / "a"
    )
    wait_for(lambda: not runtime.is_running(first), what="the first container to exit")
    port = free_port()
    second = runtime.start(http_server_plan("c2-name", port), tmp_path / "b")
    try:
        assert second.container_id != first.container_id
        assert runtime._find(first) is None  # the old one is gone; a stale state never finds the new one
        assert runtime.is_running(second) and not runtime.is_running(first)
        runtime.stop(first)  # stopping by a stale state leaves the new container alone
        assert runtime.is_running(second)
        # a running one is left to the caller, with a clear error
        with pytest.raises(RuntimeFailure) as err:
            runtime.start(http_server_plan("c2-name", free_port()), tmp_path / "c")
        assert str(err.value) == "container sparkctl-c2-name for recipe c2-name is already running"
        assert err.value.hint == "stop it first: sparkctl down c2-name"
    finally:
        runtime.stop(second)

    # a container sparkctl did not create is never touched
    foreign = docker_client.containers.create("sparkctl-test:cpu", ["true"], name="sparkctl-c2-foreign")
    try:
        with pytest.raises(RuntimeFailure) as err:
            runtime.start(make_plan("c2-foreign", ["true"], port=free_port()), tmp_path / "d")
        assert str(err.value) == "a container named sparkctl-c2-foreign exists that sparkctl did not create"
        docker_client.containers.get(foreign.id)  # still there
    finally:
        foreign.remove(force=True)


def test_mount_sources(runtime, tmp_path) -> None:
    missing = tmp_path / "not-there"
    plan = make_plan("c2-mount", ["true"], port=free_port(), mounts=(Mount(str(missing), "/data", True),))
    with pytest.raises(RuntimeFailure, match=r"mount source .*not-there does not exist"):
        runtime.start(plan, tmp_path / "l")

    # a writable mount is a cache: created when missing, and the container can write to it
    cache = tmp_path / "jit-cache"
    script = "open('/jit/made-in-container', 'w').write('ok')"
    plan = make_plan(
        "c2-mount", [host_python(), "-c", script], port=free_port(), mounts=(Mount(str(cache), "/jit"),)
    )
    state = runtime.start(plan, tmp_path / "l")
    try:
        wait_for(lambda: not runtime.is_running(state), what="the script to finish")
        assert runtime.exit_detail(state) == "container exited with code 0"
        assert (cache / "made-in-container").read_text() == "ok"
    finally:
        runtime.stop(state)


@pytest.mark.skipif(
    "memory_limit" not in ContainerSpec.__dataclass_fields__, reason="ContainerSpec has no memory_limit yet"
)
def test_memory_limit_is_a_cgroup_cap(runtime, tmp_path) -> None:
    plan = make_plan(
        "c2-mem", [host_python(), "-c", "import time; time.sleep(30)"], port=free_port(), memory_limit="256m"
    )
    state = runtime.start(plan, tmp_path / "l")
    try:
        host_config = runtime.client.containers.get(state.container_id).attrs["HostConfig"]
        assert host_config["Memory"] == 256 * 1024 * 1024 == host_config["MemorySwap"]
    finally:
        runtime.stop(state, timeout_s=1)


def test_plan_without_container_settings_is_a_user_error(runtime, tmp_path) -> None:
    import dataclasses

    from sparkctl.errors import UserError

    plan = dataclasses.replace(make_plan("c2-none", ["true"], port=free_port()), container=None)
    with pytest.raises(UserError, match="has no container settings"):
        runtime.start(plan, Path(tmp_path) / "l")


def test_hf_snapshot_links_resolve_inside_the_container(runtime, tmp_path) -> None:
    snap = fake_hf_snapshot(tmp_path / "hf")
    script = "print(open('/models/tiny/config.json').read(), open('/models/tiny/sub/nested.json').read())"
    plan = make_plan(
        "c2-hf",
        [host_python(), "-c", script],
        port=free_port(),
        mounts=(Mount(str(snap), "/models/tiny", True),),
    )
    state = runtime.start(plan, tmp_path / "l")
    try:
        wait_for(lambda: not runtime.is_running(state), what="the reader to finish")
        logs = list(runtime.logs(state))
        assert runtime.exit_detail(state) == "container exited with code 0", logs
        assert logs == ['{"model_type": "llama"} {"model_type": "llama"}']
    finally:
        runtime.stop(state)


def test_ulimit_the_host_refuses_gets_a_hint(runtime, tmp_path, docker_client) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("this host allows an unlimited memlock; the refusal cannot be shown here")
    plan = make_plan(
        "c2-ulimit", [host_python(), "-c", "pass"], port=free_port(), ulimits={"memlock": (-1, -1)}
    )
    with pytest.raises(RuntimeFailure) as err:
        runtime.start(plan, tmp_path / "l")
    assert "rlimit" in str(err.value)
    assert "container.ulimits" in (err.value.hint or "")
    assert not docker_client.containers.list(all=True, filters={"name": "sparkctl-c2-ulimit"})


def test_stats_reports_what_the_container_holds(runtime, tmp_path) -> None:
    script = "import time; held = bytearray(200 * 2**20); print('holding', flush=True); time.sleep(60)"
    state = runtime.start(
        make_plan("c2-stats", [host_python(), "-c", script], port=free_port()), tmp_path / "l"
    )
    try:
        wait_for(lambda: "holding" in list(runtime.logs(state)), what="the allocation")
        stats = runtime.stats(state)
        assert stats is not None
        assert 200 * 2**20 <= stats["memory_bytes"] < 400 * 2**20, stats
    finally:
        runtime.stop(state, timeout_s=1)
    assert runtime.stats(state) is None


def test_daemon_gone_mid_session_is_one_clear_line(monkeypatch, tmp_path) -> None:
    """A runtime whose daemon disappears after connecting (a client for a socket nobody serves any
    more) reports it like `connect` does, for every call `status`, `logs` and `down` make."""
    import docker

    dead = f"unix://{tmp_path}/gone.sock"
    monkeypatch.setenv("DOCKER_HOST", dead)
    runtime = DockerRuntime()
    runtime._client = docker.DockerClient(base_url=dead, version="1.41", timeout=5)
    plan = make_plan("c2-gone", ["true"], port=free_port())
    from sparkctl.runtimes.base import ServerState

    state = ServerState(
        recipe="c2-gone", runtime="docker", recipe_hash="h", base_url="http://127.0.0.1:1", port=1,
        served_model_name="c2-gone", started_at=0.0, container_id="abc", container_name="sparkctl-c2-gone",
    )  # fmt: skip
    calls = {
        "is_running": lambda: runtime.is_running(state),
        "exit_detail": lambda: runtime.exit_detail(state),
        "stats": lambda: runtime.stats(state),
        "stop": lambda: runtime.stop(state),
        "logs": lambda: list(runtime.logs(state, tail=5)),
        "start": lambda: runtime.start(plan, tmp_path / "l"),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeFailure) as err:
            call()
        assert str(err.value) == f"Docker daemon not reachable at {dead}", name


def test_private_ipc_gets_the_recipes_shared_memory_size(runtime, tmp_path) -> None:
    script = "import os; s = os.statvfs('/dev/shm'); print(s.f_blocks * s.f_frsize)"
    plan = make_plan(
        "c2-shm", [host_python(), "-c", script], port=free_port(), ipc_host=False, shm_size="64m"
    )
    state = runtime.start(plan, tmp_path / "l")
    try:
        wait_for(lambda: not runtime.is_running(state), what="the script to finish")
        host_config = runtime.client.containers.get(state.container_id).attrs["HostConfig"]
        assert host_config["IpcMode"] != "host" and host_config["ShmSize"] == 64 * 2**20
        assert list(runtime.logs(state)) == [str(64 * 2**20)]
    finally:
        runtime.stop(state)


def test_stop_unlinks_shared_memory_the_killed_engine_leaves_on_the_host(runtime, tmp_path) -> None:
    """With the host's IPC namespace (the default), a container's /dev/shm is the host's: an engine killed after
    the grace period (it ignores SIGTERM here) leaves its segments there unless `stop` removes them."""
    script = (
        "import signal, time\n"
        "from multiprocessing import shared_memory\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "seg = shared_memory.SharedMemory(create=True, size=1 << 20)\n"
        "print('segment', seg.name, flush=True)\n"
        "time.sleep(60)\n"
    )
    state = runtime.start(
        make_plan("c2-leak", [host_python(), "-c", script], port=free_port()), tmp_path / "l"
    )
    try:
        wait_for(lambda: any(x.startswith("segment") for x in runtime.logs(state)), what="the segment")
        line = next(x for x in runtime.logs(state) if x.startswith("segment"))
        leaked = Path("/dev/shm") / line.split()[1]
        assert leaked.exists()  # the host sees it: shared IPC namespace
    finally:
        runtime.stop(state, timeout_s=1)
    assert not leaked.exists()
