"""A Plan as something a person can run by hand: a shell command, JSON, or a docker-compose file.

These are views of the same Plan that `up` executes, so what `render` prints is what `up` runs: a docker
plan's `docker run` and compose service are both translations of `container.container_run(plan)`, the
record the SDK runtime also starts its container from (tests/planner/test_container_parity.py holds the
three together). The only additions are the ones a hand-run needs (a `--rm`, the HF token passed through
from the shell: `ContainerRun.hand_run_env`).

Every value is quoted for its target, whatever the recipe says: shell words through shlex (a comment
line cannot be left by a newline in a host or a note), compose strings with `$` doubled in every field
(compose would otherwise fill `${HF_TOKEN}` in an image name with the real token). Names that a shell
or docker would read as syntax (env keys, ulimit names, an image or argv[0] starting with '-') are
refused, not quoted into something else; the schema refuses them first, this is the last line.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from typing import Any

from sparkctl.errors import UserError
from sparkctl.planner.container import ContainerRun, container_run
from sparkctl.planner.types import Plan

FORMATS = ("shell", "json", "compose")
_CONT = " \\\n"
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ULIMIT_NAME = re.compile(r"[a-z]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
# bash reserved words: as the first word of a command they are syntax, not a program name
_RESERVED = frozenset(
    ("!", "[[", "]]", "{", "}", "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for",
     "function", "if", "in", "select", "then", "time", "until", "while")
)  # fmt: skip


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    data = dataclasses.asdict(dataclasses.replace(plan, cluster=None))
    del data["cluster"]  # rendered as its own part (`up --nodes --dry-run --json`: "cluster")
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


def arg_lines(args: list[str], *, command: bool = False) -> list[str]:
    """Group `--flag value...` so each flag starts a line: long vLLM command lines stay readable.

    With `command`, args[0] is the program a shell runs, quoted as a command word."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("-") and not _is_number(arg) or not lines:
            lines.append([arg])
        else:
            lines[-1].append(arg)
    out = [shlex.join(line) for line in lines]
    if command and lines:
        out[0] = " ".join([_command_word(lines[0][0]), *map(shlex.quote, lines[0][1:])])
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _comment(text: str) -> str:
    """Text for a `# ...` line: control characters (a newline would end the comment) shown escaped."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _env_key(key: str) -> str:
    if not _ENV_KEY.fullmatch(key):
        raise UserError(f"cannot render environment variable {key!r}: not a valid variable name")
    return key


def _command_word(word: str) -> str:
    """argv[0] as the first word of a shell command: quoted so it is never an assignment or a keyword."""
    quoted = shlex.quote(word)
    if quoted == word and ("=" in word or word in _RESERVED):
        quoted = f"'{word}'"
    return quoted


def _not_a_flag(value: str, what: str) -> str:
    if value.startswith("-") or not value:
        raise UserError(f"cannot render {what} {value!r}: docker would read it as an option")
    return value


def _bind_spec(source: str, target: str, read_only: bool) -> str:
    for path in (source, target):
        if ":" in path:
            raise UserError(f"cannot render the bind mount {path!r}: docker's -v cannot take a path with ':'")
    return f"{source}:{target}" + (":ro" if read_only else "")


def render_shell(plan: Plan) -> str:
    """A copy-pasteable command: `docker run ...` for docker plans, env + the engine command natively."""
    header = _comment(
        f"# sparkctl plan for {plan.recipe_name} ({plan.engine}, {plan.runtime}); serves {plan.base_url}/v1"
    )
    header += "\n" + "".join(_comment(f"# note: {n}") + "\n" for n in plan.notes)
    if plan.cluster is not None:  # served across Sparks: what runs on which node, in order
        return str(plan.cluster.render_shell())
    if not plan.argv:
        raise UserError(f"cannot render {plan.recipe_name}: the plan has no command")
    if plan.api_key_file:  # the key itself is never rendered: only the 0600 file that holds it
        header += f"# API key: from {_comment(plan.api_key_file)} (written by `sparkctl up`)\n"
    if plan.container is None:
        lines = [f"{_env_key(k)}={shlex.quote(v)}" for k, v in plan.env.items()]
        if plan.api_key_file:
            header += f"set -a; . {shlex.quote(plan.api_key_file)}; set +a\n"
        if plan.model.needs_token:
            lines.append('HF_TOKEN="${HF_TOKEN:?set HF_TOKEN: the model repo is gated}"')
        head = arg_lines(list(plan.argv), command=True)
        lines.append(head[0])
        lines += ["  " + line for line in head[1:]]
        return header + _CONT.join(lines) + "\n"
    run = container_run(plan)
    opts = [shlex.join(group) for group in docker_run_groups(run)]
    rest = arg_lines(list(run.command))
    lines = [opts[0]] + ["  " + o for o in opts[1:]] + ["  " + r for r in rest]
    return header + _CONT.join(lines) + "\n"


def _publish_spec(host: str, port: int) -> str:
    return f"[{host}]:{port}:{port}" if ":" in host else f"{host}:{port}:{port}"


def docker_run_groups(run: ContainerRun, *, detach: bool = False) -> list[list[str]]:
    """`docker run` of `run` up to the image, one option (with its values) a group: a group is one line of
    the rendered script (shlex-joined), and all groups' words plus `run.command` are the argv.

    `detach`: started in the background and kept after it exits (a cluster node's part: its log is what
    `sparkctl logs` reads there, `down` removes it)."""
    if run.restart_policy != "no":
        first = ["docker", "run", "-d", "--restart", run.restart_policy]
    elif detach:
        first = ["docker", "run", "-d"]
    else:  # a hand-run cleans up after itself; `up` keeps a dead container's log
        first = ["docker", "run", "--rm"]
    groups = [first, ["--name", _not_a_flag(run.name, "container name")]]
    if run.init:
        groups.append(["--init"])
    if run.gpus:
        groups.append(["--gpus", "all"])
    if run.network_host:
        groups.append(["--network", "host"])
    for host, port in run.publish:
        groups.append(["-p", _publish_spec(host, port)])
    if run.ipc_host:
        groups.append(["--ipc", "host"])
    if run.shm_size:
        groups.append(["--shm-size", run.shm_size])
    if run.memory_limit:
        groups.append(["--memory", run.memory_limit, "--memory-swap", run.memory_limit])
    for name, (soft, hard) in run.ulimits.items():
        if not _ULIMIT_NAME.fullmatch(name):
            raise UserError(f"cannot render ulimit {name!r}: not a ulimit name")
        groups.append(["--ulimit", f"{name}={int(soft)}:{int(hard)}"])
    for dev in run.devices:
        groups.append(["--device", _not_a_flag(dev, "device")])
    for m in run.mounts:
        groups.append(["-v", _bind_spec(m.source, m.target, m.read_only)])
    for k, v in run.env.items():
        groups.append(["-e", f"{_env_key(k)}={v}"])
    for k in run.hand_run_env:
        groups.append(["-e", _env_key(k)])
    for f in run.env_files:
        groups.append(["--env-file", f])
    for k, v in run.labels.items():
        groups.append(["--label", f"{k}={v}"])
    h = run.healthcheck
    if h is None:  # serves no HTTP (a cluster worker): the image's own HEALTHCHECK would fail forever
        groups.append(["--no-healthcheck"])
    else:
        groups.append(["--health-cmd", h.command])
        groups.append(
            ["--health-interval", f"{h.interval_s}s", "--health-timeout", f"{h.timeout_s}s", "--health-retries",
             str(h.retries), "--health-start-period", f"{h.start_period_s}s"]
        )  # fmt: skip
    groups.append(["--entrypoint", run.entrypoint])
    groups.append([_not_a_flag(run.image, "image")])
    return groups


def _compose_escape(value: Any) -> Any:
    """Every string in a compose value with `$` doubled: compose interpolates `$VAR` and `${...}` in
    any string field (image, container_name, devices, volume sources...), the engine must see the literal."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {k: _compose_escape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_compose_escape(v) for v in value]
    return value


def compose_project_name(name: str) -> str:
    """Compose project names allow only [a-z0-9_-] (compose-spec `name`): glm-5.3-flash -> glm-5-3-flash."""
    out = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")
    return out or "sparkctl"


def render_compose(plan: Plan) -> str:
    """A docker-compose.yml equivalent of the docker plan; `docker compose up -d` runs it by hand."""
    import yaml

    if plan.container is None:
        raise UserError(
            f"recipe {plan.recipe_name} runs natively (runtime: native); compose needs a container",
            hint="--set runtime=docker --set container.image=<image>, or use --format shell",
        )
    run = container_run(plan)
    service: dict[str, Any] = {
        "image": run.image,
        "container_name": run.name,
        "entrypoint": [run.entrypoint, *run.command],
    }
    if run.init:
        service["init"] = True
    if run.network_host:
        service["network_mode"] = "host"
    if run.publish:
        service["ports"] = [
            {"target": port, "published": str(port), "host_ip": host, "protocol": "tcp"}
            for host, port in run.publish
        ]
    if run.ipc_host:
        service["ipc"] = "host"
    if run.shm_size:
        service["shm_size"] = run.shm_size
    if run.memory_limit:
        service["mem_limit"] = run.memory_limit
        service["memswap_limit"] = run.memory_limit
    if run.ulimits:
        service["ulimits"] = {
            name: {"soft": soft, "hard": hard} for name, (soft, hard) in run.ulimits.items()
        }
    if run.devices:
        for d in run.devices:
            if ":" in d:
                raise UserError(f"cannot render device {d!r}: compose cannot take a path with ':'")
        service["devices"] = [f"{d}:{d}" for d in run.devices]
    if run.mounts:
        service["volumes"] = [
            {
                "type": "bind",
                "source": m.source,
                "target": m.target,
                "read_only": m.read_only,
                "bind": {"create_host_path": True},
            }
            for m in run.mounts
        ]
    service["environment"] = {_env_key(k): v for k, v in run.env.items()}
    if run.env_files:  # compose reads the key from the 0600 file; it is never inline
        service["env_file"] = list(run.env_files)
    service["labels"] = dict(run.labels)
    if run.gpus:
        service["deploy"] = {
            "resources": {
                "reservations": {"devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}
            }
        }
    h = run.healthcheck
    service["healthcheck"] = (
        {"disable": True}
        if h is None
        else {
            "test": ["CMD-SHELL", h.command],
            "interval": f"{h.interval_s}s",
            "timeout": f"{h.timeout_s}s",
            "retries": h.retries,
            "start_period": f"{h.start_period_s}s",
        }
    )
    service["restart"] = run.restart_policy
    service = _compose_escape(service)
    for k in run.hand_run_env:  # the one deliberate interpolation: the token comes from the caller's shell
        service["environment"][_env_key(k)] = f"${{{k}:?set {k}: the model repo is gated}}"
    doc = {"name": compose_project_name(run.name), "services": {plan.recipe_name.replace(".", "-"): service}}
    header = (
        f"# docker-compose file for the sparkctl recipe {plan.recipe_name} (recipe hash {plan.recipe_hash[:12]}).\n"
        f"# Generated by `sparkctl render {plan.recipe_name} --format compose`; run it by hand with\n"
        "#   docker compose -f <this file> up -d\n"
        f"# then the OpenAI API is at {plan.base_url}/v1 once the healthcheck passes.\n"
    )
    # split on "\n" only: str.splitlines also breaks at U+2028, \x1c... inside a value, and the rest of that
    # line would start a YAML line of its own; _comment escapes those
    header = "".join(_comment(line) + "\n" for line in header.rstrip("\n").split("\n"))
    for note in plan.notes:
        header += _comment(f"# note: {note}") + "\n"
    for warning in plan.warnings:
        header += _comment(f"# warning: {warning}") + "\n"
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100_000, allow_unicode=True)
    if yaml.safe_load(body) != doc:
        # PyYAML's emitter writes some characters raw that its reader folds (NEL, U+2028 in a plain or
        # single-quoted scalar); escaped ASCII output reads back exactly.
        body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100_000)
    return header + body
