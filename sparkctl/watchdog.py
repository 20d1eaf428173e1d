"""The unified-memory watchdog (recipe `memory.watchdog`): a small process beside a running server.

On a Spark the GPU, the CPU and the page cache share one pool; an engine that keeps growing (a KV cache
sized too large, a leak) takes the host down with it, and the box wedges instead of the process dying.
So, while a server runs, this samples MemAvailable and, below the floor, writes why into the server's
log and stops the server cleanly (its runtime's `stop`: SIGTERM first), leaving the host usable.

Started by `up` once the server is healthy (`python -m sparkctl.watchdog RECIPE FLOOR INTERVAL`), in
its own session; it ends by itself when the server is gone or its state file removed, and `down`
ends it too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from sparkctl.runtimes import state as state_files
from sparkctl.runtimes.base import ServerState
from sparkctl.runtimes.registry import get_runtime

MARK = "sparkctl.watchdog"


def mem_available() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _log(st: ServerState, line: str) -> None:
    if st.log_path:
        with contextlib.suppress(OSError), open(st.log_path, "a", encoding="utf-8") as fh:
            fh.write(f"# sparkctl watchdog: {line}\n")


def watch(recipe: str, floor: int, interval_s: float, *, started_at: float | None = None) -> str:
    """Run until the server is gone (returns "gone") or memory fell below `floor` (stops it, returns "stopped")."""
    while True:
        st = state_files.load(recipe)
        if st is None or (started_at is not None and abs(st.started_at - started_at) > 1e-3):
            return "gone"  # stopped by `down`, or replaced by a new `up` with a watchdog of its own
        runtime = get_runtime(st.runtime)
        if not runtime.is_running(st):
            return "gone"
        available = mem_available()
        if available < floor:
            _log(
                st,
                f"MemAvailable {_gib(available)} is below the floor {_gib(floor)} (memory.watchdog): "
                f"stopping {recipe} before the host runs out of memory",
            )
            runtime.stop(st, timeout_s=30.0)
            state_files.remove(recipe)
            return "stopped"
        time.sleep(interval_s)


def start(st: ServerState, floor: int, interval_s: float) -> int:
    """Spawn the watchdog for a healthy server; returns its pid (recorded in the state's `extra`)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", MARK, st.recipe, str(floor), str(interval_s), repr(st.started_at)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return proc.pid


def stop(st: ServerState) -> None:
    """End the server's watchdog, if it has one and that pid is still a watchdog."""
    pid = int(st.extra.get("watchdog_pid") or 0)
    if pid <= 0:
        return
    import psutil

    with contextlib.suppress(psutil.Error, ProcessLookupError):
        proc = psutil.Process(pid)
        argv = proc.cmdline()
        # only this recipe's watchdog: a record is a claim, not proof (see runtimes.identity)
        if argv[1:4] == ["-m", MARK, st.recipe] and pid not in (1, os.getpid()):
            proc.send_signal(signal.SIGTERM)


def main(argv: list[str]) -> int:
    recipe, floor, interval = argv[0], int(argv[1]), float(argv[2])
    started_at = float(argv[3]) if len(argv) > 3 else None
    watch(recipe, floor, interval, started_at=started_at)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a process by `start`
    sys.exit(main(sys.argv[1:]))
