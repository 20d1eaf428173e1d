"""The native runtime: the engine as a supervised child process on the host, in its own process group.

Used for the embedded `tiny` recipe (vLLM on the CPU, no Docker needed) and for anyone who installed
vLLM themselves. The server runs in a new session, so a Ctrl-C in the user's terminal does not reach
it once `up` has returned, and `stop` can signal the whole group: vLLM forks an engine-core process
and workers that must go down with the API server, or they keep the memory and the port.

A pid alone is not an identity (pids are reused, and a state file can be stale or forged), so the server
carries a marker in its environment (runtimes.identity) and only processes that carry it are ever
signalled; the leader's start time is recorded and compared too.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from sparkctl.errors import RuntimeFailure, write_failure
from sparkctl.planner.adapters import adapter_for
from sparkctl.planner.types import Plan
from sparkctl.runtimes import base
from sparkctl.runtimes.base import ServerState
from sparkctl.runtimes.common import started_state
from sparkctl.runtimes.identity import MARKER_ENV, is_ours, new_marker, protected_pids
from sparkctl.runtimes.shm import held_segments, remove_leftovers
from sparkctl.server.auth import env_of

# psutil derives start times from the boot time and the kernel's clock ticks (10 ms), so two reads of
# the same process agree exactly; the slack only absorbs float formatting in the state file.
_CREATE_TIME_SLACK_S = 0.001


def require_executable(plan: Plan) -> None:
    """The one executable check: `up` runs it before a download of many GB, `start` again before it spawns."""
    if plan.argv and shutil.which(plan.argv[0]) is None:
        raise RuntimeFailure(
            f"cannot start {plan.recipe_name}: executable {plan.argv[0]!r} not found",
            hint=adapter_for(plan.engine).install_hint + " or set engine.entrypoint",
        )


class NativeRuntime:
    """Runtime protocol implementation for a host process (see sparkctl.runtimes.base.Runtime)."""

    name = "native"
    capabilities = frozenset({base.PERSIST, base.API_KEY, base.LOCAL_MODEL, base.WATCHDOG})

    def __init__(self) -> None:
        # Children started by this process: kept so they can be reaped (no zombies while `up` waits)
        # and so an early exit reports the real exit code.
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # -- protocol ------------------------------------------------------------------------------------

    def ensure_ready(self, plan: Plan) -> Plan:
        """The engine's executable must be installed: said before a download of many GB, not after."""
        require_executable(plan)
        return plan

    def parts(self, state: ServerState) -> list[dict[str, Any]]:
        return []

    def persistence(
        self, plan: Plan, log_path: Path, *, install: bool, strict: bool = True
    ) -> tuple[str, str] | None:
        """`up --persist`: a systemd user unit, (path, text); rendered (strict: refusing what a unit cannot
        hold) before anything starts, installed once healthy."""
        from sparkctl.runtimes import systemd

        if install:
            unit = systemd.install(plan, log_path)
            return str(unit), unit.read_text()
        return str(systemd.unit_path(plan.recipe_name)), systemd.render_unit(plan, log_path, strict=strict)

    def check(self) -> None:
        """The native runtime needs POSIX process groups; everything else is checked at start."""
        if os.name != "posix":
            raise RuntimeFailure(
                "the native runtime needs a POSIX system (process groups)",
                hint="use the docker runtime: --runtime docker",
            )

    def start(self, plan: Plan, log_path: Path, progress: Callable[[str], None] | None = None) -> ServerState:
        """Spawn `plan.argv` with `plan.env` in a new session; stdout and stderr go to `log_path`."""
        if not plan.argv:
            raise RuntimeFailure(f"recipe {plan.recipe_name}: the plan has an empty command line")
        require_executable(plan)
        # the API key comes from its 0600 env file straight into the environment: not argv, not the log
        env = {**os.environ, **plan.env, **env_of(plan.api_key_file)}
        env.pop("SPARKCTL_API_KEY", None)  # `up`'s own input; the engine has its engine's variable
        marker = env[MARKER_ENV] = new_marker(plan.recipe_name)
        # Unbuffered so the health gate's "last log line" is the server's latest, not one a pipe holds.
        env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(log_path, "ab")  # noqa: SIM115 - closed below, after the child has its copy
            log.write(f"# sparkctl: starting {plan.recipe_name}: {shlex.join(plan.argv)}\n".encode())
            log.flush()
        except OSError as exc:  # a full disk or a read-only state dir: said before anything runs
            raise write_failure(log_path, exc) from None
        with log:
            try:
                proc = subprocess.Popen(
                    list(plan.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise RuntimeFailure(f"cannot start {plan.recipe_name}: {exc}") from exc
        self._children[proc.pid] = proc
        try:
            create_time = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            create_time = 0.0  # exited already; is_running() is False and exit_code() tells why
        return started_state(
            plan,
            self.name,
            log_path,
            pid=proc.pid,
            extra={
                "create_time": repr(create_time),
                "pgid": str(proc.pid),
                "argv": shlex.join(plan.argv),
                "marker": marker,
            }
            | ({"api_key_file": plan.api_key_file} if plan.api_key_file else {}),
        )

    def is_running(self, state: ServerState) -> bool:
        proc = self._leader(state)
        if proc is None:
            return False
        try:
            return proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def exit_code(self, state: ServerState) -> int | None:
        """The leader's exit status if it was our child and has exited (negative: killed by that signal)."""
        child = self._children.get(state.pid or -1)
        return None if child is None else child.poll()

    def stop(self, state: ServerState, timeout_s: float = 30.0) -> None:
        """SIGTERM the process group, wait up to `timeout_s`, then SIGKILL what is left, and unlink the shared
        memory the server held that outlived it (shm.py). Idempotent."""
        members = self._members(state)
        segments = held_segments(members)
        signalled: set[int] = set()
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0), (signal.SIGKILL, 5.0)):
            if not members:
                break
            self._signal(state, members, sig)
            signalled.update(p.pid for p in members)
            left = self._wait_gone(state, members, wait_s)
            # and what was forked between the look and the signal (a new worker), proven ours like the rest
            members = left + [p for p in self._members(state) if p.pid not in signalled and _is_live(p)]
        self._reap(state)
        if members:
            names = ", ".join(f"{p.pid}" for p in members)
            raise RuntimeFailure(
                f"could not stop {state.recipe}: processes {names} survive SIGKILL",
                hint="they may be stuck in the kernel (D state); check `ps -o pid,stat,cmd -p ...`",
            )
        remove_leftovers(segments)

    def logs(self, state: ServerState, *, tail: int | None = None, follow: bool = False) -> Iterator[str]:
        """Lines of the server's log file; with `follow`, keep yielding until the server is gone."""
        if not state.log_path:
            return iter(())
        return follow_file(
            Path(state.log_path), tail=tail, follow=follow, alive=lambda: self.is_running(state)
        )

    def exit_detail(self, state: ServerState) -> str | None:
        """Why the server is not running ("exited with code 1", "killed by SIGKILL"), None while it runs."""
        if self.is_running(state):
            return None
        code = self.exit_code(state)
        if code is None:
            return "the server process is gone"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            why = " (the kernel's OOM killer sends this)" if code == -signal.SIGKILL else ""
            return f"process was killed by {name}{why}"
        return f"process exited with code {code}"

    def stats(self, state: ServerState) -> dict[str, int] | None:
        """Resident memory of the whole process tree (API server + engine core + workers), in bytes."""
        members = self._members(state)
        if not members:
            return None
        total = 0
        for p in members:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return {"memory_bytes": total, "processes": len(members)}

    # -- internals -----------------------------------------------------------------------------------

    def _leader(self, state: ServerState) -> psutil.Process | None:
        """The recorded leader, if it is provably the process sparkctl started: same start time, and our
        marker in its environment (a record from before markers: the same command line instead)."""
        if not state.pid or state.pid in protected_pids():
            return None
        try:
            proc = psutil.Process(state.pid)
            started = proc.create_time()
        except psutil.Error:
            return None
        recorded = _float(state.extra.get("create_time"))
        if recorded is None or abs(started - recorded) > _CREATE_TIME_SLACK_S:
            return None  # the pid was reused by an unrelated process, or the record never said when
        marker = state.extra.get("marker")
        child = self._children.get(state.pid)
        if child is not None and child.returncode is None:
            return proc  # our own child (between fork and exec its environment is still ours, unmarked)
        if marker:
            return proc if is_ours(proc, marker) else None
        with contextlib.suppress(psutil.Error):
            if shlex.join(proc.cmdline()) == state.extra.get("argv"):
                return proc
        return None

    def _members(self, state: ServerState) -> list[psutil.Process]:
        """Every live process of the server, each proven ours: it carries the server's marker (the engine
        core and workers inherit it, also after the API server died or when they left its group) and
        started no earlier than the leader. A record without a marker (written before markers) gets
        only the descendants of its verified leader; a record that proves nothing gets nothing.
        """
        marker = state.extra.get("marker")
        leader = self._leader(state)
        if not marker:
            if leader is None:
                return []
            with contextlib.suppress(psutil.Error):
                return [leader, *leader.children(recursive=True)]
            return []
        not_before = (_float(state.extra.get("create_time")) or 0.0) - _CREATE_TIME_SLACK_S
        protected = protected_pids()
        found: list[psutil.Process] = []
        for proc in psutil.process_iter(["pid", "create_time", "status"]):
            try:
                if proc.pid in protected or proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                created = proc.info["create_time"]  # None where psutil could not read it
                if created is not None and created >= not_before and is_ours(proc, marker):
                    found.append(proc)
            except (OSError, psutil.Error):
                continue
        if leader is not None and leader.pid not in {p.pid for p in found}:
            found.append(leader)
        return found

    def _signal(self, state: ServerState, members: list[psutil.Process], sig: signal.Signals) -> None:
        """The leader's own process group when the leader is proven ours and leads it (that reaches a
        worker forked a moment ago too), and each proven member by itself. Never a group number taken
        from a record: that could be anyone's. psutil's send_signal checks the pid is still the process
        it listed."""
        leader = self._leader(state)
        if leader is not None:
            with contextlib.suppress(OSError):
                if os.getpgid(leader.pid) == leader.pid:
                    os.killpg(leader.pid, sig)
        for p in members:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    def _wait_gone(
        self, state: ServerState, members: list[psutil.Process], timeout_s: float
    ) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout_s
        alive = members
        while True:
            # Reap through Popen, not psutil.wait_procs: the latter would swallow our child's exit status.
            self._reap(state)
            alive = [p for p in alive if _is_live(p)]
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.1)

    def _reap(self, state: ServerState) -> None:
        child = self._children.get(state.pid or -1)
        if child is not None:
            child.poll()


def follow_file(
    path: Path,
    *,
    tail: int | None = None,
    follow: bool = False,
    alive: Callable[[], bool] | None = None,
    poll_s: float = 0.25,
) -> Iterator[str]:
    """Yield the lines of a log file (the last `tail` ones), then, with `follow`, new lines as written.

    Following stops once `alive()` turns False and everything written has been read, the way
    `docker logs -f` ends with its container.
    """
    try:
        fh = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 (generator owns it)
    except FileNotFoundError:
        return
    with fh:
        lines = deque(fh, maxlen=tail) if tail is not None else fh
        pending = ""
        for line in lines:
            if follow and not line.endswith("\n"):
                pending = line  # the last line, still being written: finish it before yielding
                break
            yield line.rstrip("\n")
        if not follow:
            return
        while True:
            chunk = fh.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    yield pending.rstrip("\n")
                    pending = ""
                continue
            if alive is not None and not alive():
                rest = fh.read()
                if pending or rest:
                    for line in (pending + rest).splitlines():
                        yield line
                return
            time.sleep(poll_s)


def tail_lines(path: Path | str | None, n: int) -> list[str]:
    """The last `n` lines of a file, or [] when it does not exist."""
    if not path:
        return []
    return list(follow_file(Path(path), tail=n))


def _is_live(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
