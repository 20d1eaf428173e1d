"""Issue 27 on the docker runtime: `up --persist` gives the container restart policy unless-stopped (the
daemon brings it back after a reboot or a crash; `down` removes it with its policy), and an API key
reaches the container from its env file only."""

from __future__ import annotations

import os
import signal

import pytest
from dockerkit import free_port, host_python, make_plan, wait_for

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
