"""Which processes are a server that sparkctl started: proven, never taken from a state file on trust.

A state file is only a claim (it can be stale, damaged or written by someone else), and a pid or a
process group number alone is not an identity: pids are reused, and a forged record can name any
process tree. So the native runtime puts a marker in the server's environment when it starts it
(`SPARKCTL_SERVER=<nonce>:<state dir tag>:<recipe>`, inherited by the engine core and workers, readable only by their
owner), records it, and every signal goes only to processes that carry that exact marker, started no
earlier than the recorded leader, and are neither pid 1 nor this process or one of its ancestors.

The marker also finds a server again when its state file is gone or damaged (`marked_servers`), only
among the servers of this state directory: another sparkctl state (a test's, a second install) is not
ours to list or stop.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass

import psutil

from sparkctl.runtimes.base import ServerState

MARKER_ENV = "SPARKCTL_SERVER"
LABEL_STATE = "io.sparkctl.state"  # a container's state directory tag (the docker runtime's marker)


def state_tag() -> str:
    """This state directory, as a short tag in the marker."""
    import hashlib

    from sparkctl import paths

    return hashlib.sha256(str(paths.state_dir().resolve()).encode()).hexdigest()[:12]


def new_marker(recipe: str) -> str:
    """A marker no other server has: a random nonce, this state directory's tag, then the recipe name
    (for `status` without state)."""
    return f"{secrets.token_hex(8)}:{state_tag()}:{recipe}"


def recipe_of(marker: str) -> str:
    return marker.split(":", 2)[-1]


def marker_of(proc: psutil.Process) -> str | None:
    """The marker in a process's environment; None when it has none or it cannot be read (another
    user's process: not ours either)."""
    try:
        return proc.environ().get(MARKER_ENV)
    except (psutil.Error, OSError):
        return None


def protected_pids() -> frozenset[int]:
    """Never signalled whatever a record says: pid 0/1, this process and every ancestor (a record naming
    the shell that runs `sparkctl down` must not kill it)."""
    pids = {0, 1, os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return frozenset(pids)


def is_ours(proc: psutil.Process, marker: str | None) -> bool:
    """True only when `proc` carries `marker` and is not protected."""
    return bool(marker) and proc.pid not in protected_pids() and marker_of(proc) == marker


@dataclass(frozen=True)
class MarkedServer:
    """A server found by its marker alone: its processes, the oldest first (the leader, when alive)."""

    marker: str
    recipe: str
    processes: tuple[psutil.Process, ...]

    @property
    def leader(self) -> psutil.Process:
        return self.processes[0]

    def port(self) -> int | None:
        """The `--port` the engine was started with, when its command line says."""
        with contextlib.suppress(psutil.Error, ValueError, IndexError):
            argv = self.leader.cmdline()
            return int(argv[argv.index("--port") + 1])
        return None


def marked_servers() -> list[MarkedServer]:
    """Every live server of this user that sparkctl started, found by marker (no state file needed)."""
    protected = protected_pids()
    tag = state_tag()
    found: dict[str, list[tuple[float, psutil.Process]]] = {}
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        if proc.pid in protected or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        marker = marker_of(proc)
        if marker and marker.split(":", 2)[1:2] == [tag]:
            found.setdefault(marker, []).append((proc.info["create_time"] or 0.0, proc))
    return [
        MarkedServer(
            marker, recipe_of(marker), tuple(p for _, p in sorted(procs, key=lambda t: (t[0], t[1].pid)))
        )
        for marker, procs in sorted(found.items())
    ]


def recovered_state(server: MarkedServer) -> ServerState:
    """A record for a server found by its marker alone (its state file gone or damaged), enough for
    `status` to show it and `down` to stop it: the native runtime proves it again before any signal."""
    from sparkctl.runtimes.state import log_path

    leader = server.leader
    port = server.port() or 0
    try:
        started = leader.create_time()
        argv = leader.cmdline()
    except psutil.Error:
        started, argv = 0.0, []
    host = "127.0.0.1"
    if "--host" in argv[:-1]:
        host = argv[argv.index("--host") + 1]
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url_host = f"[{host}]" if ":" in host else host
    return ServerState(
        recipe=server.recipe,
        runtime="native",
        recipe_hash="",
        base_url=f"http://{url_host}:{port}",
        port=port,
        served_model_name=server.recipe,
        started_at=started,
        log_path=str(log_path(server.recipe)),
        pid=leader.pid,
        extra={"marker": server.marker, "create_time": repr(started), "recovered": "marker"},
    )


def labelled_containers() -> list[ServerState]:
    """Records for the containers this state directory started, found by their labels (no state file
    needed); [] when no Docker daemon answers (a machine without Docker has none of ours)."""
    import os

    from sparkctl.errors import RuntimeFailure
    from sparkctl.planner.container import LABEL_MANAGED, LABEL_PORT, LABEL_RECIPE
    from sparkctl.runtimes.docker import connect, docker_host
    from sparkctl.runtimes.state import log_path

    host = docker_host()
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        return []  # no daemon here: not even a connection attempt
    try:
        client = connect(timeout_s=5)
    except RuntimeFailure:
        return []
    out: list[ServerState] = []
    try:
        found = client.containers.list(
            all=True, filters={"label": [f"{LABEL_MANAGED}=true", f"{LABEL_STATE}={state_tag()}"]}
        )
        for c in found:
            labels = c.labels or {}
            recipe = labels.get(LABEL_RECIPE)
            if not recipe:
                continue
            try:
                port = int(labels.get(LABEL_PORT) or 0)
            except ValueError:
                port = 0
            out.append(
                ServerState(
                    recipe=recipe,
                    runtime="docker",
                    recipe_hash="",
                    base_url=f"http://127.0.0.1:{port}",
                    port=port,
                    served_model_name=recipe,
                    started_at=0.0,
                    log_path=str(log_path(recipe)),
                    container_id=c.id,
                    container_name=c.name,
                    extra={"recovered": "label"},
                )
            )
    except Exception:  # a daemon that stops answering mid-list: what was found so far
        pass
    finally:
        client.close()
    return out
