"""The real engine's word on it: the container `render --format shell` creates and the one the SDK runtime
creates are configured the same (`docker inspect`), but for the name and the hand-run's `--rm`.

tests/planner/test_container_parity.py compares the three translations as text; this one lets dockerd
read the rendered `docker run` and the SDK kwargs, so a flag the CLI reads differently from the SDK
(a unit, a default) shows up too. Containers are only created, never started.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from dockerkit import free_port, host_python, make_plan

from sparkctl.planner.container import container_run
from sparkctl.planner.render import render
from sparkctl.planner.types import Mount
from sparkctl.runtimes.docker import create_kwargs

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("test_image", "no_leaks")]


def _config(attrs: dict[str, Any]) -> dict[str, Any]:
    cfg, host = attrs["Config"], attrs["HostConfig"]
    return {
        "image": cfg["Image"],
        "entrypoint": cfg["Entrypoint"],
        "cmd": cfg["Cmd"],
        "env": sorted(e for e in cfg["Env"] if not e.startswith("PATH=")),
        "labels": cfg["Labels"],
        "healthcheck": cfg.get("Healthcheck"),
        "init": host.get("Init"),
        "network": host["NetworkMode"],
        "ipc": host["IpcMode"],
        "shm": host["ShmSize"],
        "ulimits": sorted((u["Name"], u["Soft"], u["Hard"]) for u in host.get("Ulimits") or []),
        "devices": host.get("Devices") or [],
        "gpus": [(r["Count"], r["Capabilities"]) for r in host.get("DeviceRequests") or []],
        "memory": (host["Memory"], host["MemorySwap"]),
        "restart": host["RestartPolicy"]["Name"] or "no",
        "ports": host.get("PortBindings") or {},
        "mounts": sorted((m["Source"], m["Destination"], m["RW"]) for m in attrs["Mounts"]),
    }


@pytest.mark.parametrize("bridge", [False, True], ids=["host-network", "bridge-private-ipc"])
def test_rendered_docker_run_and_sdk_create_the_same_container(
    docker_client, tmp_path: Path, bridge: bool
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    p = make_plan(
        f"c2-parity-{int(bridge)}",
        [host_python(), "-c", "import time; time.sleep(60)"],
        port=free_port(),
        env={"SPARKCTL_TEST_ENV": "a b $c"},
        mounts=(Mount(source=str(cache), target="/c"),),
        network_host=not bridge,
        ipc_host=not bridge,
        shm_size="64m",
        memory_limit="512m",
        restart_policy="unless-stopped" if bridge else "no",
    )
    run = container_run(p)
    sdk_name, cli_name = f"{run.name}-sdk", f"{run.name}-cli"
    words = shlex.split(render(p, "shell").replace("\\\n", " "), comments=True)
    assert words[:2] == ["docker", "run"]
    # what only a hand-run adds: `--rm` (`up` keeps a dead container for its log); `-d` is run's, not create's
    assert words[2] == ("-d" if bridge else "--rm")
    del words[2]
    i = words.index("--name")
    words[i + 1] = cli_name
    kwargs = create_kwargs(run) | {"name": sdk_name}
    made = []
    try:
        subprocess.run(
            ["docker", "create", *words[2:]], check=True, capture_output=True, text=True, timeout=60
        )
        made.append(cli_name)
        docker_client.containers.create(**kwargs)
        made.append(sdk_name)
        cli = _config(docker_client.api.inspect_container(cli_name))
        sdk = _config(docker_client.api.inspect_container(sdk_name))
    finally:
        for name in made:
            docker_client.containers.get(name).remove(force=True)
    assert cli == sdk
    assert sdk["init"] is True
    assert f"SPARKCTL_PORT={p.port}" in sdk["env"]
    assert sdk["healthcheck"]["Test"] == ["CMD-SHELL", run.healthcheck.command]
    if bridge:  # the recipe's /dev/shm size and the port, published on the plan's address only
        assert sdk["shm"] == 64 * 2**20
        assert sdk["ports"] == {f"{p.port}/tcp": [{"HostIp": p.host, "HostPort": str(p.port)}]}
    else:
        assert (sdk["network"], sdk["ipc"]) == ("host", "host")
