"""Shared-memory segments that a stopped server left behind in /dev/shm.

Why: vLLM's processes talk through POSIX shared memory (Python's `multiprocessing.shared_memory`, files named
`psm_*` in /dev/shm, plus multiprocessing's semaphores `sem.mp-*`). A server that exits cleanly unlinks them; one
that is killed (the SIGKILL after `down`'s grace period, a crash) cannot, and every leaked segment keeps the pages
its server touched in RAM until reboot. On a Spark that is unified memory the next model needs. So the runtimes
note which segments the server's processes hold before stopping them, and unlink those that outlive them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")


def held_segments(processes: Iterable[psutil.Process], shm_dir: Path = SHM_DIR) -> set[Path]:
    """Files directly under `shm_dir` that these processes have mapped or open (unreadable processes skipped)."""
    found: set[Path] = set()
    for proc in processes:
        with contextlib.suppress(psutil.Error, OSError):
            for m in proc.memory_maps(grouped=False):
                found.add(Path(m.path))
        with contextlib.suppress(psutil.Error, OSError):
            for f in proc.open_files():
                found.add(Path(f.path))
    return {p for p in found if p.parent == shm_dir}


def remove_leftovers(segments: Iterable[Path]) -> list[Path]:
    """Unlink the segments that still exist (their server is gone; a clean exit removed its own already)."""
    removed = []
    for path in sorted(segments):
        try:
            path.unlink()
        except OSError:  # gone already, or not ours to remove (another user's): leave it
            continue
        removed.append(path)
    return removed
