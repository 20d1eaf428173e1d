"""Whether a process the code under test stopped is gone, without racing its reaping.

`not pid_exists(pid) or Process(pid).status() == ZOMBIE` raced: a zombie reaped between the two calls made
`Process(pid)` raise NoSuchProcess, and a test that was right failed (seen once in a CI run).
"""

from __future__ import annotations

import psutil


def gone(pid: int) -> bool:
    """True once `pid` has exited: no such process, or a zombie waiting for its parent."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
