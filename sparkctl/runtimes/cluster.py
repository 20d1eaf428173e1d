"""The cluster runtime: one plan served across Sparks, behind the same contract as `docker` and `native`.

`start` runs every step of the plan's per-node launch (`Plan.cluster`, made from the node probes) on its
node and records each container and process it started (on which node) in the recipe's one state file
(sparkctl.runtimes.state), saved after every step, so `down` removes all of them, `status` shows each
and `logs` reads every node's, exactly as for a single-node server.

The server's endpoint is checked from here, so `up --nodes` runs on the head (the first node must be
this machine). Any failure during start stops what was started, in reverse order.
"""

from __future__ import annotations

import contextlib
import queue
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkctl.cluster.launch import NodeStep
from sparkctl.cluster.nodes import Node, popen_on, run_on
from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.planner.types import Plan
from sparkctl.runtimes import base
from sparkctl.runtimes import state as state_files
from sparkctl.runtimes.base import ServerState
from sparkctl.runtimes.common import started_state

RAY_WAIT_S = 180.0


@dataclass
class Started:
    node: str
    kind: str  # "container" | "process"
    ident: str  # container id, or the pid (= process group) on that node
    what: str
    log: str = ""  # where its output goes on that node (processes; the server in a container)
    container: str = ""  # the container a `docker exec` server runs in


def _node(state: ServerState, address: str) -> Node:
    for n in state.nodes:
        if n["address"] == address:
            return Node(**n)
    raise KeyError(address)


def _started(state: ServerState) -> list[Started]:
    return [Started(**p) for p in state.parts]


class ClusterRuntime:
    """Runtime protocol implementation for a plan served across nodes (`up --nodes`, cluster.hosts)."""

    name = "cluster"
    capabilities = frozenset({base.API_KEY, base.MULTI_NODE})

    def check(self) -> None:
        """Each node was checked by the cluster preflight (SSH, link, image, model) when it was planned."""

    def ensure_ready(self, plan: Plan) -> Plan:
        if plan.cluster is None:
            raise UserError(f"recipe {plan.recipe_name} has no per-node launch: name its nodes with --nodes")
        return plan

    def start(self, plan: Plan, log_path: Path, progress: Callable[[str], None] | None = None) -> ServerState:
        """Run every step of the plan's launch on its node; returns the state (saved after each step)
        once the server step started. A failure stops what was started, last first."""
        say = progress or (lambda line: None)
        launch, nodes = plan.cluster.launch, list(plan.cluster.report.nodes)
        if not nodes[0].is_local:
            raise UserError(
                f"run `sparkctl up` on the head: the first of --nodes ({nodes[0].address}) must be this "
                "machine (localhost), where the endpoint is checked"
            )
        by_addr = {n.address: n for n in nodes}
        state = started_state(
            plan,
            self.name,
            log_path,
            extra={"executor": launch.executor, "node_runtime": launch.runtime}
            | ({"api_key_file": plan.api_key_file} if plan.api_key_file else {}),
        )
        state.log_path = None  # every part logs on its own node (`logs` reads them there)
        state.nodes = [asdict(n) for n in nodes]
        state_files.save(state)
        try:
            for i, step in enumerate(launch.steps):
                node = by_addr[step.node]
                if step.wait_gpus:
                    _wait_ray(node, step, say)
                    continue
                started = _run_step(node, step, launch.recipe_name, i)
                if started is not None:
                    state.parts.append(asdict(started))
                    state_files.save(state)
                say(f"{step.node}: {step.what}")
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop(state)
                state_files.remove(state.recipe)
            raise
        return state

    def is_running(self, state: ServerState) -> bool:
        rows = self.parts(state)
        return bool(rows) and all(r["running"] for r in rows)

    def exit_detail(self, state: ServerState) -> str | None:
        """Why the cluster cannot become healthy any more: the first of its parts no longer running."""
        for row in self.parts(state):
            if not row["running"]:
                return f"{row['what']} on {row['node']} is not running"
        return None

    def stats(self, state: ServerState) -> dict[str, int] | None:
        return {} if self.is_running(state) else None

    def parts(self, state: ServerState) -> list[dict[str, Any]]:
        return status_rows(state)

    def persistence(
        self, plan: Plan, log_path: Path, *, install: bool, strict: bool = True
    ) -> tuple[str, str] | None:
        raise UserError("the cluster runtime cannot do --persist")  # refused earlier: no PERSIST capability

    def stop(self, state: ServerState, timeout_s: float = 30.0) -> None:
        stop(state, timeout_s)

    def logs(self, state: ServerState, *, tail: int | None = None, follow: bool = False) -> Iterator[str]:
        if follow:
            return follow_lines(state, tail=tail)
        return iter(log_lines(state, tail=tail))


def _run_step(node: Node, step: NodeStep, recipe: str, index: int) -> Started | None:
    argv = list(step.argv)
    if argv[:3] == ["docker", "run", "-d"]:
        name = argv[argv.index("--name") + 1]
        run_on(node, f"docker rm -f {shlex.quote(name)} >/dev/null 2>&1 || true\n", timeout_s=60)
        out = _check(node, shlex.join(argv), step.what, timeout_s=600)
        return Started(step.node, "container", out.strip().splitlines()[-1][:64], step.what, container=name)
    if argv[:2] == ["docker", "exec"] and step.server:
        name = argv[2]
        log_file = f"/tmp/sparkctl-{recipe}-server.log"
        inner = shlex.join(argv[3:])
        cmd = ["docker", "exec", "-d", name, "sh", "-c", f"exec {inner} > {log_file} 2>&1"]
        _check(node, shlex.join(cmd), step.what)
        return Started(step.node, "exec", name, step.what, log=log_file, container=name)
    if argv[0] == "docker":
        _check(node, shlex.join(argv), step.what)
        return None
    if argv[:2] == ["sh", "-c"]:
        _check(node, shlex.join(["env", *(f"{k}={v}" for k, v in step.env.items()), *argv]), step.what)
        return None
    # a native process: its own session (pid = process group), output to a log on that node
    log_file = f"/tmp/sparkctl-{recipe}-{index}-{step.role}.log"
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in step.env.items())
    # the API key from its 0600 file into the environment, never onto a command line (`ps` shows those)
    keys = "".join(f"set -a; . {shlex.quote(f)}; set +a\n" for f in step.env_files)
    script = f"{keys}setsid env {env} {shlex.join(argv)} > {log_file} 2>&1 < /dev/null &\necho $!\n"
    out = _check(node, script, step.what)
    return Started(step.node, "process", out.strip().splitlines()[-1], step.what, log=log_file)


def _check(node: Node, script: str, what: str, *, timeout_s: float = 120.0) -> str:
    proc = run_on(node, script + "\n", timeout_s=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise RuntimeFailure(f"node {node.address}: {what} failed: {tail[0][:300]}")
    return proc.stdout


_NODE_LINE = re.compile(r"^\s*\d+\s+node_[0-9a-f]+", re.MULTILINE)


def ray_node_count(status_text: str) -> int:
    """Active nodes in `ray status` output (the `Active:` block lists `1 node_<id>` per node)."""
    active = status_text.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in status_text else ""
    return len(_NODE_LINE.findall(active))


def _wait_ray(node: Node, step: NodeStep, log: Callable[[str], None]) -> None:
    want = step.wait_gpus or 0
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in step.env.items())
    cmd = (f"env {env} " if env else "") + shlex.join(step.argv) + " 2>&1"
    deadline = time.monotonic() + RAY_WAIT_S
    seen = 0
    while time.monotonic() < deadline:
        proc = run_on(node, cmd + "\n", timeout_s=60)
        seen = ray_node_count(proc.stdout)
        if seen >= want:
            log(f"{step.node}: Ray lists {seen} nodes")
            return
        time.sleep(2)
    raise RuntimeFailure(
        f"Ray lists {seen} of {want} nodes after {RAY_WAIT_S:.0f} s",
        hint="check the worker can reach the head's Ray port over the CX7 link (`sparkctl cluster check`), "
        "and the worker's log (`sparkctl logs RECIPE`)",
    )


def stop(state: ServerState, timeout_s: float = 30.0) -> list[str]:
    """Stop everything the launch started, last first; returns what was stopped. Stopped ones are fine."""
    done = []
    for s in reversed(_started(state)):
        node = _node(state, s.node)
        if s.kind == "container":
            run_on(node, f"docker rm -f {shlex.quote(s.ident)} >/dev/null 2>&1 || true\n", timeout_s=120)
        elif s.kind == "process":
            pid = int(s.ident)
            script = (
                f"kill -TERM -{pid} 2>/dev/null || exit 0\n"
                f"i=0; while kill -0 -{pid} 2>/dev/null && [ $i -lt {int(timeout_s * 10)} ]; do sleep 0.1; i=$((i+1)); done\n"
                f"kill -KILL -{pid} 2>/dev/null || true\n"
            )
            run_on(node, script, timeout_s=timeout_s + 30)
        done.append(f"{s.node}: {s.what}")
    return done


def status_rows(state: ServerState) -> list[dict[str, Any]]:
    """One row per part on each node: what it is, whether it still runs, where it logs."""
    rows = []
    for s in _started(state):
        node = _node(state, s.node)
        if s.kind in ("container", "exec"):
            target = s.container or s.ident
            proc = run_on(
                node, f"docker inspect -f '{{{{.State.Status}}}}' {shlex.quote(target)} 2>/dev/null\n"
            )
            alive = proc.stdout.strip() == "running"
        else:
            proc = run_on(node, f"kill -0 -{int(s.ident)} 2>/dev/null && echo running\n")
            alive = proc.stdout.strip() == "running"
        rows.append(
            {"node": s.node, "what": s.what, "kind": s.kind, "id": s.ident, "running": alive, "log": s.log}
        )
    return rows


def log_lines(state: ServerState, tail: int | None = None) -> list[str]:
    """Every node's logs, each line prefixed with its node (what `sparkctl logs` prints for a cluster)."""
    out = []
    n = f"-n {tail}" if tail is not None else "-n +1"
    for s in _started(state):
        node = _node(state, s.node)
        if s.kind == "container":
            cmd = f"docker logs {'--tail ' + str(tail) if tail is not None else ''} {shlex.quote(s.ident)} 2>&1\n"
        elif s.kind == "exec":
            cmd = f"docker exec {shlex.quote(s.container)} tail {n} {shlex.quote(s.log)} 2>&1\n"
        else:
            cmd = f"tail {n} {shlex.quote(s.log)} 2>&1\n"
        proc = run_on(node, cmd)
        out += [f"[{s.node}] {line}" for line in proc.stdout.splitlines()]
    return out


def _follow_script(s: Started, tail: int | None) -> str:
    """Follow one part's log on its node until this side closes the script's stdin (then the follower
    is killed there too: no `tail -F` is left behind on the worker after Ctrl-C)."""
    n = str(tail if tail is not None else 10)
    if s.kind == "container":
        follow = f"docker logs -f --tail {n} {shlex.quote(s.ident)} 2>&1"
    elif s.kind == "exec":
        follow = f"docker exec {shlex.quote(s.container)} tail -n {n} -F {shlex.quote(s.log)} 2>&1"
    else:
        follow = f"tail -n {n} -F {shlex.quote(s.log)} 2>/dev/null"
    return f"{follow} &\nt=$!\ncat >/dev/null\nkill $t 2>/dev/null\n"


def follow_lines(state: ServerState, tail: int | None = None, *, poll_s: float = 0.5) -> Iterator[str]:
    """`logs --follow` for a cluster: every part's log on every node at once, each line prefixed with
    its node, as the lines come; ends when the launch is taken down (its state file is gone) or the
    caller stops iterating (Ctrl-C), and then ends every follower on every node."""
    lines: queue.Queue[str | None] = queue.Queue()
    procs = []
    for s in _started(state):
        proc = popen_on(_node(state, s.node), _follow_script(s, tail))
        procs.append(proc)

        def pump(p: Any = proc, prefix: str = f"[{s.node}] ") -> None:
            assert p.stdout is not None
            for line in p.stdout:
                lines.put(prefix + line.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
    path = state_files.state_path(state.recipe)
    open_streams = len(procs)
    try:
        while open_streams and path.exists():
            try:
                item = lines.get(timeout=poll_s)
            except queue.Empty:
                continue
            if item is None:
                open_streams -= 1
            else:
                yield item
        while True:  # what arrived before the end
            try:
                item = lines.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                yield item
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                if p.stdin is not None:
                    p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
