"""The Docker SDK call, `render --format shell` and `render --format compose` describe the same container.

All three are translations of `container_run(plan)`; this reads each one back the way its consumer does
(the SDK kwargs as given, the script through shlex, the compose file through YAML) into the same neutral
record, field by field, for every built-in docker recipe and for a plan that sets every optional field.
A field one translation forgets (as `--init` and SPARKCTL_PORT once were) fails here.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkctl.planner import plan as make_plan
from sparkctl.planner.container import container_run
from sparkctl.planner.render import render
from sparkctl.planner.types import Plan
from sparkctl.recipe import builtin_names, load_recipe
from sparkctl.runtimes.docker import create_kwargs
from sparkctl.server.auth import env_of

DOCKER_RECIPES = [n for n in builtin_names() if load_recipe(n).runtime == "docker"]


def _seconds(text: str) -> int:
    assert text.endswith("s"), text
    return int(text[:-1])


def _ulimit_pair(text: str) -> tuple[int, int]:
    soft, _, hard = text.partition(":")
    return int(soft), int(hard or soft)


def from_sdk(kw: dict[str, Any]) -> dict[str, Any]:
    hc = kw["healthcheck"]
    ns = 1_000_000_000
    return {
        "image": kw["image"],
        "name": kw["name"],
        "entrypoint": list(kw["entrypoint"]),
        "command": list(kw["command"]),
        "env": dict(kw["environment"]),
        "mounts": [(m["Source"], m["Target"], bool(m["ReadOnly"])) for m in kw["mounts"]],
        "devices": [tuple(d.split(":")[:2]) for d in kw.get("devices", [])],
        "gpus": [(r["Count"], r["Capabilities"]) for r in kw.get("device_requests", [])] == [(-1, [["gpu"]])],
        "ulimits": {u["Name"]: (u["Soft"], u["Hard"]) for u in kw["ulimits"]},
        "shm_size": kw.get("shm_size"),
        "ipc": kw.get("ipc_mode"),
        "network": kw.get("network_mode"),
        "ports": sorted((h, p, int(c.split("/")[0])) for c, (h, p) in kw.get("ports", {}).items()),
        "memory": (kw.get("mem_limit"), kw.get("memswap_limit")),
        "init": kw["init"],
        "labels": dict(kw["labels"]),
        "restart": (kw.get("restart_policy") or {"Name": "no"})["Name"],
        "health": (
            list(hc["test"]),
            hc["interval"] // ns,
            hc["timeout"] // ns,
            hc["retries"],
            hc["start_period"] // ns,
        ),
    }


def parse_docker_run(words: list[str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """A `docker run` argv as the docker CLI reads the options sparkctl writes; (record, env files, names
    taken from the caller's environment)."""
    assert words[:2] == ["docker", "run"], words[:2]
    out: dict[str, Any] = {
        "env": {}, "mounts": [], "devices": [], "gpus": False, "ulimits": {}, "shm_size": None, "ipc": None,
        "network": None, "ports": [], "memory": (None, None), "init": False, "labels": {}, "restart": "no",
    }  # fmt: skip
    env_files: list[str] = []
    passed: list[str] = []
    health: dict[str, str] = {}
    i = 2
    while words[i].startswith("-"):
        flag = words[i]
        if flag in ("--rm", "-d", "--init", "--no-healthcheck"):
            out["init"] = out["init"] or flag == "--init"
            if flag == "--no-healthcheck":
                health["off"] = "1"
            i += 1
            continue
        value = words[i + 1]
        i += 2
        if flag == "--name":
            out["name"] = value
        elif flag == "--restart":
            out["restart"] = value
        elif flag == "--gpus":
            out["gpus"] = value == "all"
        elif flag == "--network":
            out["network"] = value
        elif flag == "-p":
            host, _, rest = value.rpartition(":")
            host, _, published = host.rpartition(":")
            out["ports"].append((host.strip("[]"), int(published), int(rest)))
        elif flag == "--ipc":
            out["ipc"] = value
        elif flag == "--shm-size":
            out["shm_size"] = value
        elif flag == "--memory":
            out["memory"] = (value, out["memory"][1])
        elif flag == "--memory-swap":
            out["memory"] = (out["memory"][0], value)
        elif flag == "--ulimit":
            name, _, pair = value.partition("=")
            out["ulimits"][name] = _ulimit_pair(pair)
        elif flag == "--device":
            out["devices"].append((value, value))
        elif flag == "-v":
            parts = value.split(":")
            out["mounts"].append((parts[0], parts[1], parts[2:] == ["ro"]))
        elif flag == "-e":
            key, sep, val = value.partition("=")
            if sep:
                out["env"][key] = val
            else:
                passed.append(key)
        elif flag == "--env-file":
            env_files.append(value)
        elif flag == "--label":
            key, _, val = value.partition("=")
            out["labels"][key] = val
        elif flag == "--entrypoint":
            out["entrypoint"] = [value]
        elif flag.startswith("--health-"):
            health[flag] = value
        else:
            raise AssertionError(f"unexpected docker run option {flag}")
    out["image"] = words[i]
    out["command"] = words[i + 1 :]
    out["health"] = (
        None
        if "off" in health
        else (
            ["CMD-SHELL", health["--health-cmd"]],
            _seconds(health["--health-interval"]),
            _seconds(health["--health-timeout"]),
            int(health["--health-retries"]),
            _seconds(health["--health-start-period"]),
        )
    )
    return out, env_files, passed


def from_shell(script: str) -> tuple[dict[str, Any], list[str], list[str]]:
    words = shlex.split(script.replace("\\\n", " "), comments=True)
    return parse_docker_run(words)


def from_compose(text: str) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    (svc,) = yaml.safe_load(text)["services"].values()

    def lit(value: Any) -> Any:  # compose reads `$$` as a literal `$`
        return value.replace("$$", "$") if isinstance(value, str) else value

    env = {k: lit(v) for k, v in svc.get("environment", {}).items()}
    interpolated = {k: v for k, v in env.items() if v.startswith("${")}
    hc = svc["healthcheck"]
    rec = {
        "image": lit(svc["image"]),
        "name": lit(svc["container_name"]),
        "entrypoint": [lit(svc["entrypoint"][0])],
        "command": [lit(a) for a in svc["entrypoint"][1:]],
        "env": {k: v for k, v in env.items() if k not in interpolated},
        "mounts": [(lit(v["source"]), lit(v["target"]), v["read_only"]) for v in svc.get("volumes", [])],
        "devices": [tuple(lit(d).split(":")) for d in svc.get("devices", [])],
        "gpus": svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
        == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}],
        "ulimits": {k: (v["soft"], v["hard"]) for k, v in svc.get("ulimits", {}).items()},
        "shm_size": svc.get("shm_size"),
        "ipc": svc.get("ipc"),
        "network": svc.get("network_mode"),
        "ports": sorted((p["host_ip"], int(p["published"]), p["target"]) for p in svc.get("ports", [])),
        "memory": (svc.get("mem_limit"), svc.get("memswap_limit")),
        "init": svc.get("init", False),
        "labels": {k: lit(v) for k, v in svc.get("labels", {}).items()},
        "restart": svc["restart"],
        "health": (
            [lit(t) for t in hc["test"]],
            _seconds(hc["interval"]),
            _seconds(hc["timeout"]),
            hc["retries"],
            _seconds(hc["start_period"]),
        ),
    }
    return rec, [lit(f) for f in svc.get("env_file", [])], interpolated


def check_same_container(p: Plan) -> None:
    run = container_run(p)
    sdk = from_sdk(create_kwargs(run))
    shell, shell_files, passed = from_shell(render(p, "shell"))
    compose, compose_files, interpolated = from_compose(render(p, "compose"))
    file_env = {k: v for f in run.env_files for k, v in env_of(f).items()}
    # the SDK reads the env files itself; the hand-runs leave that to docker
    assert sdk.pop("env") == file_env | run.env
    for rec in (shell, compose):
        assert rec.pop("env") == run.env
    assert sdk == shell, "SDK kwargs and `render --format shell` differ"
    assert sdk == compose, "SDK kwargs and `render --format compose` differ"
    assert shell_files == compose_files == list(run.env_files)
    assert passed == list(interpolated) == list(run.hand_run_env)
    # the fields the bug report named, spelled out
    assert sdk["init"] is True
    assert run.env["SPARKCTL_PORT"] == str(p.port)
    assert f":{p.port}/health" in sdk["health"][0][1]


@pytest.mark.parametrize("name", DOCKER_RECIPES)
def test_builtin_recipe_is_one_container_in_all_three(name: str) -> None:
    check_same_container(make_plan(load_recipe(name), check_memory=False))


def test_every_optional_field_reaches_all_three(tmp_path: Path) -> None:
    """Bridge network, private IPC with a size, devices, a memory cap, a restart policy, an API key file
    and a gated model: the fields no built-in recipe sets together."""
    base = make_plan(load_recipe(DOCKER_RECIPES[0]), check_memory=False)
    key_file = tmp_path / "api-key.env"
    key_file.write_text("SPARKCTL_API_KEY=sk-test\n")
    assert base.container is not None
    p = dataclasses.replace(
        base,
        port=8123,
        container=dataclasses.replace(
            base.container,
            network_host=False,
            ipc_host=False,
            shm_size="8g",
            devices=("/dev/infiniband",),
            memory_limit="100g",
            restart_policy="unless-stopped",
        ),
        api_key_file=str(key_file),
        model=dataclasses.replace(base.model, needs_token=True),
    )
    check_same_container(p)
    run = container_run(p)
    assert run.publish == ((p.host, 8123),) and run.shm_size == "8g" and run.hand_run_env == ("HF_TOKEN",)


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_every_cluster_node_runs_the_same_container(executor: str) -> None:
    """Serving across Sparks, each node's `docker run` is the same container description as the single
    node's (`container_run`): only what is per node by design differs (its name and role, its command,
    its own network variables; the API key file and the healthcheck stay with the head's server)."""
    from sparkctl.cluster.launch import LABEL_ROLE, plan_launch
    from sparkctl.cluster.netenv import PER_NODE_VARS, NodeNetwork

    recipe = load_recipe("glm-5.3-flash-4bpw-2x", [f"cluster.executor={executor}"])
    p = make_plan(recipe, check_memory=False)
    single, _, _ = from_shell(render(p, "shell"))
    nodes = [
        NodeNetwork("a", "enp1s0f1np1", "192.168.100.10", 9000, ("roceP2p1s0f1",), 3),
        NodeNetwork("b", "enp1s0f0np0", "192.168.100.11", 9000, ("roceP2p1s0f0",), 5),
    ]
    launch = plan_launch(p, recipe.cluster, nodes)
    runs = [s for s in launch.steps if s.argv[:2] == ("docker", "run")]
    assert [s.node for s in runs] == ["a", "b"]
    per_node = ("name", "command", "entrypoint", "env", "labels", "health")
    for step in runs:
        node, _, _ = parse_docker_run(list(step.argv))
        assert {k: v for k, v in node.items() if k not in per_node} == {
            k: v for k, v in single.items() if k not in per_node
        }, step.node
        shared = {k: v for k, v in node["env"].items() if k not in PER_NODE_VARS}
        common = {k: v for k, v in single["env"].items() if k not in PER_NODE_VARS}
        assert {k: shared.get(k) for k in common} == common  # the plan's env, SPARKCTL_PORT too
        assert node["labels"] == {**single["labels"], LABEL_ROLE: step.role}
        assert node["health"] == (single["health"] if step.role == "head" else None)
