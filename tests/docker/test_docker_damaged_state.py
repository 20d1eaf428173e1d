"""A docker server whose state file was damaged or deleted is still found (by its container's labels,
scoped to this state directory) and stopped: `status` shows it, `down --all` removes its container."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from dockerkit import REPO, free_port, host_python, make_plan, wait_for

from sparkctl.runtimes import state as state_files
from sparkctl.runtimes.docker import DockerRuntime

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("test_image", "no_leaks")]


def _sparkctl(*args: str, state_dir: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ} | ({"SPARKCTL_STATE_DIR": state_dir} if state_dir else {})
    return subprocess.run(
        [sys.executable, "-m", "sparkctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


@pytest.mark.parametrize("damage", ["garbage", "deleted"])
def test_a_container_whose_state_file_was_lost_is_found_by_label_and_stopped(tmp_path, damage: str) -> None:
    runtime = DockerRuntime()
    port = free_port()
    plan = make_plan(
        "lost", [host_python(), "-m", "http.server", str(port), "--bind", "127.0.0.1"], port=port
    )
    state = runtime.start(plan, tmp_path / "lost.log")
    try:
        state_files.save(state)
        wait_for(lambda: runtime.is_running(state), what="the container")
        path = state_files.state_path("lost")
        if damage == "deleted":
            path.unlink()
        else:
            path.write_text("{garbage")
        other = _sparkctl("status", "--json", state_dir=str(tmp_path / "other-state"))
        assert other.returncode == 0 and json.loads(other.stdout) == [], other.stdout  # not another state's
        status = _sparkctl("status", "--json")
        assert status.returncode == 0, status.stderr
        rows = json.loads(status.stdout)
        assert [(r["recipe"], r["runtime"], r["container"]) for r in rows] == [
            ("lost", "docker", "sparkctl-lost")
        ]
        assert "found by its container labels" in status.stderr
        down = _sparkctl("down", "--all")
        assert down.returncode == 0 and "stopped lost" in down.stdout, down.stdout + down.stderr
        assert runtime.client.containers.list(all=True, filters={"id": state.container_id}) == []
    finally:
        runtime.stop(state, timeout_s=5)
