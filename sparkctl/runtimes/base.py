"""The runtime contract: how a Plan becomes a running server, and how that server is found again.

A runtime knows processes or containers; it never reads a recipe. Everything it needs is on the Plan,
and everything `down`/`status`/`logs` need later is on the ServerState it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sparkctl.errors import UserError
from sparkctl.planner.types import Plan

# What a runtime can do for a launch, named so `up` checks a request against it before any work starts
# (a key, --persist or --nodes on a runtime that cannot honour it is refused in one line, not half-done).
PERSIST = "persist"  # comes back after a reboot (docker restart policy, a systemd user unit)
API_KEY = "api_key"  # hands an API key to the engine from its 0600 env file
MULTI_NODE = "multi_node"  # serves one plan across several machines
LOCAL_MODEL = "local_model"  # fetches, prepares and pre-warms the model on this machine before launch
WATCHDOG = "watchdog"  # the memory watchdog can stop it


@dataclass
class ServerState:
    """Persisted as JSON, one file per running recipe (see sparkctl.runtimes.state)."""

    recipe: str
    runtime: str  # "docker" | "native" | "cluster"
    recipe_hash: str
    base_url: str
    port: int
    served_model_name: str
    started_at: float  # time.time()
    log_path: str | None = None  # native: the server's log file
    pid: int | None = None  # native: leader of the server's process group
    container_id: str | None = None  # docker
    container_name: str | None = None  # docker
    extra: dict[str, str] = field(default_factory=dict)
    # cluster: the nodes ([user@]host[:port] records) and every part started on them, in start order
    nodes: list[dict[str, Any]] = field(default_factory=list)
    parts: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


class Runtime(Protocol):
    name: str
    capabilities: frozenset[str]

    def check(self) -> None:
        """Raise RuntimeFailure (clear one-line message + hint) if this runtime cannot be used here."""

    def ensure_ready(self, plan: Plan) -> Plan:
        """Make what the plan runs present (image, installed binary) before a long fetch or pre-warm, and
        return the plan with anything decided here written into it, so what runs is what was shown."""

    def start(self, plan: Plan, log_path: Path, progress: Callable[[str], None] | None = None) -> ServerState:
        """Start the server in the background and return at once; health gating is the caller's job.
        `progress` hears each part started, where a start has several (a cluster's nodes)."""

    def is_running(self, state: ServerState) -> bool: ...

    def stop(self, state: ServerState, timeout_s: float = 30.0) -> None:
        """Stop and remove everything `start` created. Idempotent: a gone server is not an error."""

    def logs(self, state: ServerState, *, tail: int | None = None, follow: bool = False) -> Iterator[str]: ...

    def exit_detail(self, state: ServerState) -> str | None:
        """Why the server is not running ("exited with code 1", "OOM-killed"), None while it runs: the
        health gate says *how* a server died during start-up, not only that it did."""

    def stats(self, state: ServerState) -> dict[str, int] | None:
        """What `status` shows about a running server: at least `memory_bytes`; None when it is not running."""

    def parts(self, state: ServerState) -> list[dict[str, Any]]:
        """One record per part on each node (`status` shows them); [] for a single-node server."""

    def persistence(
        self, plan: Plan, log_path: Path, *, install: bool, strict: bool = True
    ) -> tuple[str, str] | None:
        """`up --persist` (PERSIST): what brings the server back after a reboot, as (path, text) when it
        is a file (a systemd unit), None when the plan carries it (a restart policy). `install` False:
        only rendered, for the dry run and to refuse a bad value before anything starts."""


def check_capabilities(runtime: Runtime, needed: Iterable[str], why: dict[str, str]) -> None:
    """Refuse, before any work, a request this runtime cannot honour (`why[capability]` says which)."""
    missing = [c for c in needed if c not in runtime.capabilities]
    if missing:
        asked = ", ".join(why.get(c, c) for c in missing)
        raise UserError(f"the {runtime.name} runtime cannot do {asked}")
