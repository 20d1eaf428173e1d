"""What runs on each node to serve one plan across Sparks, as records (`NodeStep`s) that `up --nodes`
runs in order and `--dry-run` prints.

Ray executor: a Ray head container on the head and a Ray worker container on every other node, each
`ray start --block` with the node's own address and environment, usage stats off; once Ray reports every
GPU, the server runs inside the head's container with vLLM's Ray executor. The per-node variables are
listed in vLLM's ray_non_carry_over_env_vars.json there, so the head's interface, HCA and GID index are
not copied onto the worker's ranks. mp executor: the same `vllm serve` on every node with --nnodes,
--node-rank and --master-addr, the workers --headless.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sparkctl.cluster.netenv import PER_NODE_VARS, NodeNetwork
from sparkctl.errors import UserError
from sparkctl.planner.container import PORT_ENV, container_run
from sparkctl.planner.render import arg_lines, docker_run_groups

LABEL_ROLE = "io.sparkctl.cluster-role"

RAY_PORT = 6379
MASTER_PORT = 29501
VLLM_CONFIG_ROOT = "/root/.config/vllm"
NON_CARRY_OVER_FILE = f"{VLLM_CONFIG_ROOT}/ray_non_carry_over_env_vars.json"


@dataclass(frozen=True)
class NodeStep:
    node: str
    role: Literal["head", "worker"]
    what: str  # one line shown before the command
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # for native steps; docker steps carry -e flags
    # native steps: env files sourced first (the API key's 0600 file: the key is never on a command line)
    env_files: tuple[str, ...] = ()
    wait_gpus: int | None = None  # a wait step: poll `argv` until Ray lists this many GPUs
    server: bool = False  # the server itself (in a running container: started detached, its log kept there)


@dataclass(frozen=True)
class ClusterLaunch:
    recipe_name: str
    executor: Literal["ray", "mp"]
    runtime: Literal["docker", "native"]
    head: str
    nodes: tuple[str, ...]
    env: dict[str, dict[str, str]]  # node -> the full environment of its processes
    steps: tuple[NodeStep, ...]
    container_names: dict[str, str]  # node -> container sparkctl started there (docker)

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe_name,
            "executor": self.executor,
            "runtime": self.runtime,
            "head": self.head,
            "nodes": list(self.nodes),
            "env": self.env,
            "containers": self.container_names,
            "steps": [
                {
                    "node": s.node,
                    "role": s.role,
                    "what": s.what,
                    "argv": list(s.argv),
                    "env": s.env,
                    "env_files": list(s.env_files),
                }
                for s in self.steps
            ],
        }


def plan_launch(plan: Any, cluster: Any, networks: list[NodeNetwork]) -> ClusterLaunch:
    """Per-node commands for `plan` over `networks` (head first), from the recipe's cluster block."""
    executor = cluster.executor
    if executor not in ("ray", "mp"):
        raise UserError(
            f"serving over {len(networks)} nodes needs cluster.executor ray or mp, not {executor}"
        )
    if len(networks) != cluster.nodes:
        raise UserError(
            f"recipe {plan.recipe_name} is planned for cluster.nodes={cluster.nodes}, "
            f"--nodes names {len(networks)}"
        )
    head = networks[0]
    shared = {k: v for k, v in plan.env.items() if k not in PER_NODE_VARS}
    shared["MASTER_ADDR"] = head.address
    shared["RAY_USAGE_STATS_ENABLED"] = "0"
    if executor == "ray":
        shared["VLLM_CONFIG_ROOT"] = (
            VLLM_CONFIG_ROOT if plan.container else shared.get("VLLM_CONFIG_ROOT", "")
        )
        if not shared["VLLM_CONFIG_ROOT"]:
            del shared["VLLM_CONFIG_ROOT"]
    env = {n.node: {**shared, **n.env()} for n in networks}
    ray_port = getattr(cluster, "ray_port", RAY_PORT)
    master_port = getattr(cluster, "master_port", MASTER_PORT)
    steps: list[NodeStep] = []
    names: dict[str, str] = {}
    docker = plan.container is not None
    key_files = (plan.api_key_file,) if plan.api_key_file else ()  # the server's; it runs on the head
    if executor == "ray":
        name = f"sparkctl-ray-{plan.recipe_name}"
        gpus = "1" if plan.device == "cuda" else "0"
        for i, n in enumerate(networks):
            ray_args = ["start", "--block", f"--node-ip-address={n.address}", f"--num-gpus={gpus}"]
            ray_args += ["--disable-usage-stats"]
            if i == 0:
                ray_args[1:1] = ["--head", f"--port={ray_port}"]
            else:
                ray_args.insert(1, f"--address={head.address}:{ray_port}")
            role: Literal["head", "worker"] = "head" if i == 0 else "worker"
            what = f"Ray {role} ({n.interface} {n.address})"
            if docker:
                names[n.node] = name
                argv = docker_run(plan, env[n.node], name, role, "ray", ray_args)
                steps.append(NodeStep(n.node, role, what, argv))
            else:
                steps.append(NodeStep(n.node, role, what, (_ray_cli(plan), *ray_args), env=env[n.node]))
        status = ("docker", "exec", name, "ray", "status") if docker else (_ray_cli(plan), "status")
        steps.append(
            NodeStep(
                head.node,
                "head",
                f"wait until Ray lists {len(networks)} nodes",
                status,
                env={} if docker else env[head.node],
                wait_gpus=len(networks),
            )
        )
        carry = json.dumps(list(PER_NODE_VARS), separators=(",", ":"))
        write = f"mkdir -p {VLLM_CONFIG_ROOT} && printf '%s' {shlex.quote(carry)} > {NON_CARRY_OVER_FILE}"
        if docker:
            steps.append(
                NodeStep(
                    head.node,
                    "head",
                    "keep the per-node variables per node (vLLM's Ray env carry-over)",
                    ("docker", "exec", name, "sh", "-c", write),
                )
            )
            steps.append(
                NodeStep(
                    head.node,
                    "head",
                    f"the server, {_shape(cluster)} over Ray",
                    ("docker", "exec", name, *plan.argv),
                    server=True,
                )
            )
        else:
            config_root = env[head.node].get("VLLM_CONFIG_ROOT", "$HOME/.config/vllm")
            write = write.replace(VLLM_CONFIG_ROOT, config_root)
            steps.append(
                NodeStep(
                    head.node,
                    "head",
                    "keep the per-node variables per node (vLLM's Ray env carry-over)",
                    ("sh", "-c", write),
                )
            )
            steps.append(
                NodeStep(
                    head.node,
                    "head",
                    f"the server, {_shape(cluster)} over Ray",
                    plan.argv,
                    env=env[head.node],
                    env_files=key_files,
                )
            )
    else:
        name = plan.container.name if docker else ""
        for i, n in enumerate(networks):
            extra = ["--nnodes", str(len(networks)), "--node-rank", str(i)]
            extra += ["--master-addr", head.address, "--master-port", str(master_port)]
            role = "head" if i == 0 else "worker"
            if i:
                extra.append("--headless")
            what = (
                f"the server, rank 0 of {len(networks)} ({_shape(cluster)}, mp)"
                if i == 0
                else f"headless engine, rank {i} ({n.interface} {n.address})"
            )
            argv = [*(plan.argv if i == 0 else _serve_cli(plan.argv)), *extra]
            if docker:
                names[n.node] = name
                steps.append(
                    NodeStep(n.node, role, what, docker_run(plan, env[n.node], name, role, argv[0], argv[1:]))
                )
            else:
                files = key_files if role == "head" else ()
                steps.append(NodeStep(n.node, role, what, tuple(argv), env=env[n.node], env_files=files))
    return ClusterLaunch(
        recipe_name=plan.recipe_name,
        executor=executor,
        runtime="docker" if docker else "native",
        head=head.node,
        nodes=tuple(n.node for n in networks),
        env=env,
        steps=tuple(steps),
        container_names=names,
    )


def _ray_cli(plan: Any) -> str:
    """Natively, the `ray` next to the engine's Python (its venv), as a login over SSH has no venv on PATH."""
    python = plan.argv[0] if plan.argv else ""
    return (
        str(Path(python).with_name("ray"))
        if python.startswith("/") and "python" in Path(python).name
        else "ray"
    )


def _serve_cli(argv: tuple[str, ...]) -> list[str]:
    """The worker's command as `vllm serve MODEL ...`: only that CLI knows --headless (the api_server
    module would start a second engine core on the follower, which then fails)."""
    out = list(argv)
    if out[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "--model" in out:
        at = out.index("--model")
        model = out[at + 1]
        del out[at : at + 2]
        out[1:3] = ["-m", "vllm.entrypoints.cli.main", "serve", model]
    return out


def _shape(cluster: Any) -> str:
    parts = []
    if cluster.tensor_parallel > 1:
        parts.append(f"TP {cluster.tensor_parallel}")
    if cluster.pipeline_parallel > 1:
        parts.append(f"PP {cluster.pipeline_parallel}")
    return " x ".join(parts) or "one rank"


def docker_run(
    plan: Any, env: dict[str, str], name: str, role: str, entrypoint: str, args: list[str] | tuple[str, ...]
) -> tuple[str, ...]:
    """`docker run -d` of one node's part: the plan's one container description (`container_run`, as
    `up` and `render` start it: --init, SPARKCTL_PORT, the healthcheck) with this node's environment,
    name, role and command. The host network always (Ray, NCCL and the mp rendezvous need the node's own
    addresses); the API key's env file and the healthcheck on the head only, where the server listens."""
    run = container_run(plan)
    head = role == "head"
    run = dataclasses.replace(
        run,
        name=name,
        entrypoint=entrypoint,
        command=tuple(args),
        env={**env, PORT_ENV: str(plan.port)},
        env_files=run.env_files if head else (),
        gpus=run.gpus and plan.device == "cuda",
        network_host=True,
        publish=(),
        labels={**run.labels, LABEL_ROLE: role},
        healthcheck=run.healthcheck if head else None,
    )
    return (*(w for group in docker_run_groups(run, detach=True) for w in group), *run.command)


def render_launch(launch: ClusterLaunch) -> str:
    """The launch as per-node shell: what to run on which node, in order, and each node's environment."""
    out = [
        f"# sparkctl cluster plan for {launch.recipe_name}: {len(launch.nodes)} nodes, "
        f"executor {launch.executor} ({launch.runtime}), head {launch.head}"
    ]
    for node in launch.nodes:
        out.append(f"# env on {node} (computed on that node):")
        for var in PER_NODE_VARS:
            out.append(f"#   {var}={launch.env[node][var]}")
    for i, step in enumerate(launch.steps, 1):
        out.append("")
        out.append(f"# [{i}] on {step.node} ({step.role}): {step.what}")
        if step.wait_gpus:
            out.append(f"# repeat until it lists {step.wait_gpus} active nodes")
        lines = [f"set -a; . {shlex.quote(f)}; set +a;" for f in step.env_files]
        lines += [f"{k}={shlex.quote(v)}" for k, v in step.env.items()]
        lines += arg_lines(list(step.argv))  # one flag per line, as `sparkctl render` prints it
        out.append(" \\\n  ".join(lines))
    return "\n".join(out) + "\n"
