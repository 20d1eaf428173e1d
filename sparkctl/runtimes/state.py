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
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from sparkctl import paths
from sparkctl.atomic import write_atomic
from sparkctl.errors import RuntimeFailure, write_failure
from sparkctl.runtimes.base import ServerState


def servers_dir() -> Path:
    return paths.state_dir() / "servers"


def state_path(recipe: str) -> Path:
    """Recipe names are file names already; anything else (a path-like name) is flattened safely."""
    return servers_dir() / f"{paths.file_stem(recipe)}.json"


def log_path(recipe: str) -> Path:
    """The recipe's server log (this or the last launch's: it is kept after the server stops), named like its
    state file."""
    return paths.logs_dir() / f"{state_path(recipe).stem}.log"


def save(state: ServerState) -> Path:
    """Write atomically (temp file, fsync, rename): a crash never leaves half a record."""
    target = state_path(state.recipe)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(target, json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n", fsync=True)
    except OSError as exc:  # ENOSPC, EROFS: one line with the path; write_atomic left no temp file
        raise write_failure(target, exc) from None


# What each field must hold: a record of another shape (hand-edited, another tool's, a partial write of
# an older sparkctl) is refused in one line here, never a traceback wherever a field is used later.
_SHAPE: dict[str, tuple[type, ...]] = {
    "recipe": (str,),
    "runtime": (str,),
    "recipe_hash": (str,),
    "base_url": (str,),
    "port": (int,),
    "served_model_name": (str,),
    "started_at": (int, float),
    "log_path": (str, type(None)),
    "pid": (int, type(None)),
    "container_id": (str, type(None)),
    "container_name": (str, type(None)),
    "extra": (dict,),
}
_REQUIRED = ("recipe", "runtime", "recipe_hash", "base_url", "port", "served_model_name", "started_at")


def shape_problem(data: object) -> str | None:
    """Why `data` is not a server record, or None when it is one."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        return f"no {', '.join(missing)}"
    for key, types in _SHAPE.items():
        value = data.get(key)
        if key in data and (not isinstance(value, types) or isinstance(value, bool)):
            return f"{key} is {type(value).__name__}"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.get("extra", {}).items()):
        return "extra holds values that are not strings"
    return None


def _problem(data: object, source: Path) -> str | None:
    """shape_problem, and a record kept under another recipe's file name (it would never be found by name,
    so never removed by `down`)."""
    problem = shape_problem(data)
    if problem is None and isinstance(data, dict) and state_path(data["recipe"]).name != source.name:
        problem = f"it names recipe {str(data['recipe'])[:60]!r}, not the one of its file name"
    return problem


def _from_dict(data: object, source: Path) -> ServerState:
    problem = _problem(data, source)
    if problem is not None:
        raise RuntimeFailure(
            f"state file {source} is not a sparkctl server record ({problem})",
            hint=f"`sparkctl down {source.stem}` stops its server if one runs and sets the file aside",
        )
    assert isinstance(data, dict)
    known = {f.name for f in fields(ServerState)}
    return ServerState(**{k: v for k, v in data.items() if k in known})


def load(recipe: str) -> ServerState | None:
    """The state of `recipe`, or None when there is none."""
    path = state_path(recipe)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuntimeFailure(
            f"state file {path} cannot be read: {getattr(exc, 'strerror', None) or str(exc)[:80]}",
            hint=f"`sparkctl down {recipe}` stops its server if one runs and sets the file aside",
        ) from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise RuntimeFailure(
            f"state file {path} is corrupt: {str(exc)[:120]}",
            hint=f"`sparkctl down {recipe}` stops its server if one runs and sets the file aside",
        ) from None
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
        except (OSError, ValueError, RecursionError, RuntimeFailure):
            continue  # listed by damaged(): a bad record never hides a server (see servers.status_rows)
    return out


def damaged() -> list[tuple[Path, str]]:
    """The state files that are not a readable server record, each with why (for `status` and `down`)."""
    out: list[tuple[Path, str]] = []
    directory = servers_dir()
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.json")):
        try:
            problem = _problem(json.loads(path.read_text(encoding="utf-8")), path)
        except (OSError, ValueError, RecursionError) as exc:
            problem = f"unreadable: {str(exc)[:80]}"
        if problem is not None:
            out.append((path, problem))
    return out


def set_aside(recipe: str | Path) -> Path | None:
    """Move a damaged state file (of a recipe, or at a path) out of the way, kept as `<name>.json.damaged`
    to look at."""
    path = recipe if isinstance(recipe, Path) else state_path(recipe)
    target = path.with_name(path.name + ".damaged")
    try:
        path.replace(target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise write_failure(target, exc) from None
    return target


def remove(recipe: str) -> bool:
    """Delete the state file of `recipe`; True if there was one. Idempotent."""
    path = state_path(recipe)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _lock_path(recipe: str) -> Path:
    return paths.state_dir() / "locks" / f"{state_path(recipe).stem}.lock"


def _open_lock(recipe: str) -> int:
    path = _lock_path(recipe)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise write_failure(path, exc) from None


def _set_holder(fd: int, action: str) -> None:
    """Who holds the lock, for the other side: `<pid> up` or `<pid> down` (best effort: on a full disk
    the lock itself still holds, only `down` cannot name the `up` to interrupt)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {action}\n".encode(), 0)


def _holder(fd: int) -> tuple[int | None, str]:
    try:
        pid_text, _, action = os.pread(fd, 64, 0).decode("ascii", "replace").strip().partition(" ")
        return int(pid_text), action
    except ValueError:
        return None, ""


@contextlib.contextmanager
def starting(recipe: str) -> Iterator[None]:
    """Hold while `up` starts `recipe`, so two concurrent `up`s of one recipe cannot both launch, and a
    `down` knows there is an `up` to stop (`stopping`).

    Without it the loser's clean-up would remove the winner's state file and leak its server. A
    flock dies with its process, so a killed `up` never leaves a stale lock behind.
    """
    fd = _open_lock(recipe)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _, action = _holder(fd)
            if action == "down":
                raise RuntimeFailure(
                    f"`sparkctl down {recipe}` is stopping it right now",
                    hint=f"start it again once that is done: sparkctl up {recipe}",
                ) from None
            raise RuntimeFailure(
                f"another `sparkctl up {recipe}` is starting it right now",
                hint=f"wait for it to finish, then check: sparkctl status {recipe}",
            ) from None
        _set_holder(fd, "up")
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def stopping(recipe: str, *, wait_s: float = 60.0) -> Iterator[int | None]:
    """Hold the recipe's lock while `down` stops it. An `up` still starting it is interrupted first
    (SIGTERM: its own clean-up stops whatever it launched and removes the state) and waited for, so
    `down` never answers "not running" while an `up` is about to leave a server behind.

    Yields the pid of the `up` that was interrupted, or None.
    """
    import signal

    fd = _open_lock(recipe)
    interrupted: int | None = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, action = _holder(fd)
            if action == "up" and pid and pid != os.getpid():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
                    interrupted = pid
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        who = f"the `up` of {recipe} (pid {pid})" if pid else f"another sparkctl on {recipe}"
                        raise RuntimeFailure(
                            f"{who} did not let go within {wait_s:.0f}s",
                            hint=f"stop it (kill {pid}), then run `sparkctl down {recipe}` again"
                            if pid
                            else None,
                        ) from None
                    time.sleep(0.1)
        _set_holder(fd, "down")
        yield interrupted
    finally:
        os.close(fd)


def locked_recipes() -> list[str]:
    """Recipes an `up` (or a `down`) holds the lock of right now (for `down --all`)."""
    directory = paths.state_dir() / "locks"
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.glob("*.lock") if is_starting(p.stem))


def is_starting(recipe: str) -> bool:
    """True while an `up` of `recipe` holds its start lock (`starting`): the server is still coming up."""
    path = _lock_path(recipe)
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
