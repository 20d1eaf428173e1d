"""The runtime contract: how a Plan becomes a running server, and how that server is found again.

A runtime knows processes or containers; it never reads a recipe. Everything it needs is on the Plan,
and everything `down`/`status`/`logs` need later is on the ServerState it returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from sparkctl.planner.types import Plan


@dataclass
class ServerState:
    """Persisted as JSON, one file per running recipe (see sparkctl.runtimes.state)."""

    recipe: str
    runtime: str  # "docker" | "native"
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

    def to_json(self) -> dict:
        return asdict(self)


class Runtime(Protocol):
    name: str

    def check(self) -> None:
        """Raise RuntimeFailure (clear one-line message + hint) if this runtime cannot be used here."""

    def start(self, plan: Plan, log_path: Path) -> ServerState:
        """Start the server in the background and return at once; health gating is the caller's job."""

    def is_running(self, state: ServerState) -> bool: ...

    def stop(self, state: ServerState, timeout_s: float = 30.0) -> None:
        """Stop and remove everything `start` created. Idempotent: a gone server is not an error."""

    def logs(self, state: ServerState, *, tail: int | None = None, follow: bool = False) -> Iterator[str]: ...

    def exit_detail(self, state: ServerState) -> str | None:
        """Why the server is not running ("exited with code 1", "OOM-killed"), None while it runs: the
        health gate says *how* a server died during start-up, not only that it did."""

    def stats(self, state: ServerState) -> dict[str, int] | None:
        """What `status` shows about a running server: at least `memory_bytes`; None when it is not running."""
