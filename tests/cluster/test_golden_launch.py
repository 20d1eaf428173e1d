"""Golden files: what `up --nodes HEAD,WORKER --dry-run` prints for every two-node recipe, per node, with
the Ray executor and with mp. The two nodes differ the way real ones do (the worker's cable on the other
port, another GID index), so a head value leaking onto the worker shows up as a diff.

Regenerate after an intended change: UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/cluster/test_golden_launch.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sparkctl.cluster.launch import plan_launch, render_launch
from sparkctl.cluster.netenv import NodeNetwork
from sparkctl.planner import plan
from sparkctl.recipe import builtin_names, load_recipe

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
TWO_NODE = [n for n in builtin_names() if load_recipe(n).cluster.nodes == 2]
HEAD = NodeNetwork("spark-a", "enp1s0f1np1", "192.168.100.10", 9000, ("roceP2p1s0f1", "rocep1s0f1"), 3)
WORKER = NodeNetwork("spark-b", "enp1s0f0np0", "192.168.100.11", 9000, ("roceP2p1s0f0", "rocep1s0f0"), 5)


@pytest.fixture(autouse=True)
def _fixed_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.setenv("SPARKCTL_CACHE_DIR", "/cache/sparkctl")


def test_there_is_a_two_node_recipe() -> None:
    assert "glm-5.3-flash-4bpw-2x" in TWO_NODE


@pytest.mark.parametrize("executor", ["ray", "mp"])
@pytest.mark.parametrize("name", TWO_NODE)
def test_per_node_commands_match_golden(name: str, executor: str) -> None:
    recipe = load_recipe(name, [f"cluster.executor={executor}"])
    launch = plan_launch(plan(recipe, check_memory=False), recipe.cluster, [HEAD, WORKER])
    text = render_launch(launch).replace(sys.executable, "{python}")
    path = GOLDEN / f"{name}.{executor}.nodes.sh"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; create it with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} changed; if intended, regenerate with UPDATE_GOLDEN=1"
    # each node runs with its own values, never the head's
    assert launch.env["spark-b"]["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    assert launch.env["spark-b"]["NCCL_IB_GID_INDEX"] == "5"
    assert launch.env["spark-b"]["VLLM_HOST_IP"] == "192.168.100.11"
    assert launch.env["spark-a"]["NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"
    assert {e["MASTER_ADDR"] for e in launch.env.values()} == {"192.168.100.10"}
    # every node's container is the one container description `up` and `render` start (container_run)
    runs = [s.argv for s in launch.steps if s.argv[:2] == ("docker", "run")]
    assert len(runs) == 2
    for argv in runs:
        assert "--init" in argv and "SPARKCTL_PORT=8000" in argv and "--shm-size" not in argv
    head_run, worker_run = runs
    assert "--health-cmd" in head_run and "--no-healthcheck" in worker_run
    worker_cmds = [s.argv for s in launch.steps if s.node == "spark-b"]
    if executor == "ray":
        (ray_worker,) = worker_cmds
        assert "--address=192.168.100.10:6379" in ray_worker and "--block" in ray_worker
        assert "--disable-usage-stats" in ray_worker
        assert any("ray_non_carry_over_env_vars.json" in " ".join(s.argv) for s in launch.steps)
    else:
        (headless,) = worker_cmds
        assert headless[-1] == "--headless" and "--node-rank" in headless
        assert headless[headless.index("--master-addr") + 1] == "192.168.100.10"


def test_no_stale_golden_files() -> None:
    expected = {f"{n}.{e}.nodes.sh" for n in TWO_NODE for e in ("ray", "mp")}
    assert sorted(f.name for f in GOLDEN.iterdir() if f.name not in expected) == []


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_the_api_key_reaches_the_head_server_only(executor: str, tmp_path: Path) -> None:
    """With a key, the head's server gets its 0600 env file (docker: --env-file on the head's container,
    which `docker exec` inherits; native: sourced before the server starts); no worker names a file that
    exists only on the head, and the key itself is in no command."""
    import dataclasses

    recipe = load_recipe("glm-5.3-flash-4bpw-2x", [f"cluster.executor={executor}"])
    key_file = str(tmp_path / "key.env")
    p = dataclasses.replace(plan(recipe, check_memory=False), api_key_file=key_file)
    docker = plan_launch(p, recipe.cluster, [HEAD, WORKER])
    runs = {s.node: s.argv for s in docker.steps if s.argv[:2] == ("docker", "run")}
    assert runs["spark-a"][runs["spark-a"].index("--env-file") + 1] == key_file
    assert "--env-file" not in runs["spark-b"]
    native = dataclasses.replace(p, container=None, runtime="native")
    launch = plan_launch(native, recipe.cluster, [HEAD, WORKER])
    server = [s for s in launch.steps if s.what.startswith("the server")]
    assert [s.env_files for s in server] == [(key_file,)]
    assert all(s.env_files == () for s in launch.steps if s.node == "spark-b")
    assert f". {key_file}; set +a" in render_launch(launch)
