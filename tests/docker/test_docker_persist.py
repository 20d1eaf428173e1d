"""`up --persist` on docker: the container gets restart policy unless-stopped (the daemon brings it back
after a reboot or a crash), and `down` (the runtime's stop) removes it with its policy."""

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
