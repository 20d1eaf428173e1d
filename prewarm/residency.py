"""Page-cache residency (mincore) and eviction (posix_fadvise DONTNEED), both without root.

Every GiB/s figure the tool prints is paired with residency before and after, because a "fast read"
from a warm cache says nothing about the disk (see the notes: many published numbers are cache hits).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_WINDOW = 1 << 30  # map and query 1 GiB at a time so a 5 GiB shard needs a 256 KiB vector at most

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value
_LOW_BIT = bytes(i & 1 for i in range(256))


def resident_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of `path` now in the page cache (whole pages; the last page counts its real length)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        resident = 0
        for start in range(0, size, _WINDOW):
            length = min(_WINDOW, size - start)
            resident += _resident_window(fd, start, length)
        return resident
    finally:
        os.close(fd)


def _resident_window(fd: int, start: int, length: int) -> int:
    # A read-only shared mapping never faults anything in; mincore only looks at the cache.
    addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap for mincore failed: {os.strerror(err)}")
    try:
        pages = (length + PAGE_SIZE - 1) // PAGE_SIZE
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(addr, length, vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore failed: {os.strerror(err)}")
        flags = bytes(vec).translate(_LOW_BIT)  # only bit 0 means "resident"; others are reserved
        count = flags.count(1)
        if count and flags[-1]:
            # The file's last page is partial: count only the bytes that exist.
            return (count - 1) * PAGE_SIZE + (length - (pages - 1) * PAGE_SIZE)
        return count * PAGE_SIZE
    finally:
        _libc.munmap(addr, length)


def residency(files: Iterable[str | os.PathLike[str]]) -> float:
    """Fraction (0..1) of the files' bytes in the page cache; 1.0 for an empty set."""
    total = 0
    resident = 0
    for f in files:
        total += os.stat(f).st_size
        resident += resident_bytes(f)
    return resident / total if total else 1.0


@dataclass
class EvictReport:
    """What DONTNEED achieved, verified with mincore: pages a running server has mapped stay put."""

    files: list[dict[str, object]] = field(default_factory=list)
    total_bytes: int = 0
    resident_before: int = 0
    resident_after: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def residency_after(self) -> float:
        return self.resident_after / self.total_bytes if self.total_bytes else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": "evict",
            "total_bytes": self.total_bytes,
            "resident_bytes_before": self.resident_before,
            "resident_bytes_after": self.resident_after,
            "residency_before": self.resident_before / self.total_bytes if self.total_bytes else 0.0,
            "residency_after": self.residency_after,
            "seconds": round(self.seconds, 4),
            "files": self.files,
            "warnings": self.warnings,
        }


def drop(path: str | os.PathLike[str]) -> None:
    """One DONTNEED over the whole file: cheap enough to repeat every second (the steward does)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict(files: Iterable[str | os.PathLike[str]], *, verify: bool = True) -> EvictReport:
    """Drop the files from the page cache and say how much stayed (and why it might have).

    Dirty pages are not dropped by DONTNEED, so a file still resident after the first pass is
    fdatasync'ed and advised again; what remains after that is mapped or locked by someone else.
    """
    report = EvictReport()
    t0 = time.perf_counter()
    for raw in files:
        path = Path(raw)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            before = resident_bytes(path) if verify else 0
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            after = resident_bytes(path) if verify else 0
            if after > PAGE_SIZE:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                after = resident_bytes(path)
        finally:
            os.close(fd)
        report.total_bytes += size
        report.resident_before += before
        report.resident_after += after
        report.files.append(
            {"path": str(path), "bytes": size, "resident_before": before, "resident_after": after}
        )
    report.seconds = time.perf_counter() - t0
    if verify and report.total_bytes and report.residency_after > 0.01:
        report.warnings.append(
            f"{report.resident_after / 2**20:.1f} MiB stayed in the page cache: another process "
            "(a running server?) has the files mapped, or the filesystem ignores DONTNEED (tmpfs)"
        )
    return report
