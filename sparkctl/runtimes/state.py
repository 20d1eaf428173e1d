"""One JSON file per running recipe, so `down`, `status` and `logs` find a server started earlier.

Files live under `sparkctl.paths.state_dir()/servers/<recipe>.json`. Writes go to a temp file in the
same directory and are renamed into place, so a crash never leaves a half-written state file that a
later `down` would choke on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from sparkctl import paths
from sparkctl.atomic import write_atomic
from sparkctl.errors import RuntimeFailure
from sparkctl.runtimes.base import ServerState

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def servers_dir() -> Path:
    return paths.state_dir() / "servers"


def state_path(recipe: str) -> Path:
    """Recipe names are file names already; anything else (a path-like name) is flattened safely."""
    name = _SAFE.sub("_", recipe).strip("._") or "recipe"
    return servers_dir() / f"{name}.json"


def log_path(recipe: str) -> Path:
    """The recipe's server log (this or the last launch's: it is kept after the server stops), named like its
    state file."""
    return paths.logs_dir() / f"{state_path(recipe).stem}.log"


def save(state: ServerState) -> Path:
    """Write atomically (temp file, fsync, rename): a crash never leaves half a record."""
    target = state_path(state.recipe)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(target, json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n", fsync=True)


def _from_dict(data: dict, source: Path) -> ServerState:
    known = {f.name for f in fields(ServerState)}
    try:
        return ServerState(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise RuntimeFailure(
            f"state file {source} is not a sparkctl server state ({exc})",
            hint=f"remove it if no server of that recipe is running: rm {source}",
        ) from exc


def load(recipe: str) -> ServerState | None:
    """The state of `recipe`, or None when there is none."""
    path = state_path(recipe)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuntimeFailure(
            f"state file {path} is corrupt: {exc}",
            hint=f"remove it if no server of that recipe is running: rm {path}",
        ) from exc
    return _from_dict(data, path)


def load_all() -> list[ServerState]:
    """Every recorded server, sorted by recipe name; unreadable files are skipped, not fatal."""
    out: list[ServerState] = []
    directory = servers_dir()
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            out.append(_from_dict(data, path))
        except (OSError, json.JSONDecodeError, RuntimeFailure):
            continue
    return out


def remove(recipe: str) -> bool:
    """Delete the state file of `recipe`; True if there was one. Idempotent."""
    path = state_path(recipe)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


@contextlib.contextmanager
def starting(recipe: str) -> Iterator[None]:
    """Hold while `up` starts `recipe`, so two concurrent `up`s of one recipe cannot both launch.

    Without it the loser's clean-up would remove the winner's state file and leak its server. A
    flock dies with its process, so a killed `up` never leaves a stale lock behind.
    """
    lock_dir = paths.state_dir() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / f"{state_path(recipe).stem}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeFailure(
                f"another `sparkctl up {recipe}` is starting it right now",
                hint=f"wait for it to finish, then check: sparkctl status {recipe}",
            ) from None
        yield
    finally:
        os.close(fd)


def is_starting(recipe: str) -> bool:
    """True while an `up` of `recipe` holds its start lock (`starting`): the server is still coming up."""
    path = paths.state_dir() / "locks" / f"{state_path(recipe).stem}.lock"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the lock if it was taken here
    return False
