"""A Plan as something a person can run by hand: a shell command, JSON, or a docker-compose file.

These are views of the same Plan that `up` executes, so what `render` prints is what `up` runs; the
only additions are the ones a hand-run needs (a `--rm`, the HF token passed through from the shell).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from typing import Any

from sparkctl.errors import UserError
from sparkctl.planner.types import Plan

FORMATS = ("shell", "json", "compose")
_CONT = " \\\n"


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    data = dataclasses.asdict(plan)
    data["base_url"] = plan.base_url
    return data


def render(plan: Plan, fmt: str) -> str:
    if fmt == "shell":
        return render_shell(plan)
    if fmt == "json":
        return json.dumps(plan_to_dict(plan), indent=2) + "\n"
    if fmt == "compose":
        return render_compose(plan)
    raise UserError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")


def _arg_lines(args: list[str]) -> list[str]:
    """Group `--flag value...` so each flag starts a line: long vLLM command lines stay readable."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("-") and not _is_number(arg) or not lines:
            lines.append([arg])
        else:
            lines[-1].append(arg)
    return [shlex.join(line) for line in lines]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def render_shell(plan: Plan) -> str:
    """A copy-pasteable command: `docker run ...` for docker plans, env + the engine command natively."""
    header = (
        f"# sparkctl plan for {plan.recipe_name} ({plan.engine}, {plan.runtime}); serves {plan.base_url}/v1\n"
    )
    header += "".join(f"# note: {n}\n" for n in plan.notes)
    if plan.container is None:
        lines = [f"{k}={shlex.quote(v)}" for k, v in plan.env.items()]
        if plan.model.needs_token:
            lines.append('HF_TOKEN="${HF_TOKEN:?set HF_TOKEN: the model repo is gated}"')
        argv = list(plan.argv)
        head = _arg_lines(argv)
        lines.append(head[0])
        lines += ["  " + line for line in head[1:]]
        return header + _CONT.join(lines) + "\n"
    c = plan.container
    opts: list[str] = ["docker run --rm", f"--name {shlex.quote(c.name)}"]
    if c.gpus:
        opts.append("--gpus all")
    if c.network_host:
        opts.append("--network host")
    else:
        opts.append(f"-p {plan.port}:{plan.port}")
    if c.ipc_host:
        opts.append("--ipc host")
    if c.shm_size:
        opts.append(f"--shm-size {shlex.quote(c.shm_size)}")
    if c.memory_limit:
        opts.append(f"--memory {shlex.quote(c.memory_limit)} --memory-swap {shlex.quote(c.memory_limit)}")
    for name, (soft, hard) in c.ulimits.items():
        opts.append(f"--ulimit {name}={soft}:{hard}")
    for dev in c.devices:
        opts.append(f"--device {shlex.quote(dev)}")
    for m in c.mounts:
        spec = f"{m.source}:{m.target}" + (":ro" if m.read_only else "")
        opts.append(f"-v {shlex.quote(spec)}")
    for k, v in plan.env.items():
        opts.append(f"-e {shlex.quote(f'{k}={v}')}")
    if plan.model.needs_token:
        opts.append("-e HF_TOKEN")
    for k, v in c.labels.items():
        opts.append(f"--label {shlex.quote(f'{k}={v}')}")
    opts.append(f"--entrypoint {shlex.quote(plan.argv[0])}")
    opts.append(shlex.quote(c.image))
    rest = _arg_lines(list(plan.argv[1:]))
    lines = [opts[0]] + ["  " + o for o in opts[1:]] + ["  " + r for r in rest]
    return header + _CONT.join(lines) + "\n"


def _compose_escape(value: str) -> str:
    return value.replace("$", "$$")  # compose interpolates ${...}; the engine must see the literal


def compose_project_name(name: str) -> str:
    """Compose project names allow only [a-z0-9_-] (compose-spec `name`): glm-5.3-flash -> glm-5-3-flash."""
    out = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")
    return out or "sparkctl"


def render_compose(plan: Plan) -> str:
    """A docker-compose.yml equivalent of the docker plan; `docker compose up -d` runs it by hand."""
    import yaml

    c = plan.container
    if c is None:
        raise UserError(
            f"recipe {plan.recipe_name} runs natively (runtime: native); compose needs a container",
            hint="--set runtime=docker --set container.image=<image>, or use --format shell",
        )
    service: dict[str, Any] = {
        "image": c.image,
        "container_name": c.name,
        "entrypoint": [_compose_escape(a) for a in plan.argv],
    }
    if c.network_host:
        service["network_mode"] = "host"
    else:
        service["ports"] = [f"{plan.port}:{plan.port}"]
    if c.ipc_host:
        service["ipc"] = "host"
    if c.shm_size:
        service["shm_size"] = c.shm_size
    if c.memory_limit:
        service["mem_limit"] = c.memory_limit
        service["memswap_limit"] = c.memory_limit
    if c.ulimits:
        service["ulimits"] = {name: {"soft": soft, "hard": hard} for name, (soft, hard) in c.ulimits.items()}
    if c.devices:
        service["devices"] = [f"{d}:{d}" for d in c.devices]
    if c.mounts:
        service["volumes"] = [
            {
                "type": "bind",
                "source": m.source,
                "target": m.target,
                "read_only": m.read_only,
                "bind": {"create_host_path": True},
            }
            for m in c.mounts
        ]
    env = {k: _compose_escape(v) for k, v in plan.env.items()}
    if plan.model.needs_token:
        env["HF_TOKEN"] = "${HF_TOKEN:?set HF_TOKEN: the model repo is gated}"
    if env:
        service["environment"] = env
    if c.labels:
        service["labels"] = dict(c.labels)
    if c.gpus:
        service["deploy"] = {
            "resources": {
                "reservations": {"devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}
            }
        }
    probe_host = "127.0.0.1" if plan.host in ("0.0.0.0", "::") else plan.host
    url = f"http://{probe_host}:{plan.port}/health"
    if plan.engine == "vllm":
        test = ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=5)"]
    else:
        test = ["CMD", "curl", "-fsS", url]
    service["healthcheck"] = {
        "test": test,
        "interval": "30s",
        "timeout": "10s",
        "retries": 3,
        "start_period": f"{int(plan.health_timeout_s)}s",
    }
    service["restart"] = "no"
    doc = {"name": compose_project_name(c.name), "services": {plan.recipe_name.replace(".", "-"): service}}
    header = (
        f"# docker-compose file for the sparkctl recipe {plan.recipe_name} (recipe hash {plan.recipe_hash[:12]}).\n"
        f"# Generated by `sparkctl render {plan.recipe_name} --format compose`; run it by hand with\n"
        "#   docker compose -f <this file> up -d\n"
        f"# then the OpenAI API is at {plan.base_url}/v1 once the healthcheck passes.\n"
    )
    for note in plan.notes:
        header += f"# note: {note}\n"
    for warning in plan.warnings:
        header += f"# warning: {warning}\n"
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100_000, allow_unicode=True)
    return header + body
