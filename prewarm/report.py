"""The JSON report every run produces, and the one safe way to write it.

Reports go to stdout or to a file the user names; never into the model directory (the model is
input, often a shared Hugging Face cache, and a stray file there breaks revision checks).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prewarm.errors import BadInput

GiB = 1 << 30


@dataclass
class FileResult:
    path: str
    bytes: int
    bytes_read: int = 0
    seconds: float = 0.0
    resident_before: int = 0
    resident_after: int = 0
    changed: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "bytes": self.bytes,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 4),
            "resident_before": self.resident_before,
            "resident_after": self.resident_after,
            "changed": self.changed,
            "error": self.error,
        }


@dataclass
class WorkerResult:
    worker: int
    bytes: int = 0
    busy_seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        rate = self.bytes / GiB / self.busy_seconds if self.busy_seconds > 0 else 0.0
        return {
            "worker": self.worker,
            "bytes": self.bytes,
            "busy_seconds": round(self.busy_seconds, 4),
            "gib_per_s": round(rate, 3),
        }


@dataclass
class WarmReport:
    """One warm-up (or O_DIRECT disk measurement): what was read, how fast, and what ended up cached."""

    mode: str  # "warm" | "cold" | "measure-disk"
    method: str  # "pread" | "sendfile" | "o_direct" | "evict+pread"
    workers: int
    chunk_bytes: int
    files: list[FileResult] = field(default_factory=list)
    per_worker: list[WorkerResult] = field(default_factory=list)
    seconds: float = 0.0
    evict_seconds: float | None = None
    interrupted: bool = False
    mem_available_before: int | None = None
    mem_available_after: int | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    host: dict[str, object] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def bytes_read(self) -> int:
        return sum(f.bytes_read for f in self.files)

    @property
    def gib_per_s(self) -> float:
        return self.bytes_read / GiB / self.seconds if self.seconds > 0 else 0.0

    @property
    def residency_before(self) -> float:
        total = self.total_bytes
        return sum(f.resident_before for f in self.files) / total if total else 0.0

    @property
    def residency_after(self) -> float:
        total = self.total_bytes
        return sum(f.resident_after for f in self.files) / total if total else 0.0

    @property
    def failed(self) -> bool:
        """A file errored or changed under us: the warm-up cannot be trusted."""
        return any(f.error or f.changed for f in self.files)

    def to_dict(self) -> dict[str, object]:
        before = sum(f.resident_before for f in self.files)
        after = sum(f.resident_after for f in self.files)
        return {
            "mode": self.mode,
            "method": self.method,
            "workers": self.workers,
            "chunk_bytes": self.chunk_bytes,
            "total_bytes": self.total_bytes,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 4),
            "gib_per_s": round(self.gib_per_s, 3),
            "gb_per_s": round(self.bytes_read / 1e9 / self.seconds, 3) if self.seconds > 0 else 0.0,
            "evict_seconds": None if self.evict_seconds is None else round(self.evict_seconds, 4),
            "resident_bytes_before": before,
            "resident_bytes_after": after,
            "residency_before": round(self.residency_before, 4),
            "residency_after": round(self.residency_after, 4),
            "from_disk_bytes": max(0, after - before),
            # O_DIRECT bypasses the cache, so only a buffered read can be "not cold".
            "not_cold": self.method != "o_direct" and self.residency_before > 0.01,
            "interrupted": self.interrupted,
            "failed": self.failed,
            "mem_available_before": self.mem_available_before,
            "mem_available_after": self.mem_available_after,
            "per_worker": [w.to_dict() for w in self.per_worker],
            "files": [f.to_dict() for f in self.files],
            "warnings": self.warnings,
            "notes": self.notes,
            "host": self.host,
        }


def host_facts(files: Iterable[str | os.PathLike[str]]) -> dict[str, object]:
    """Kernel, filesystem and block-device readahead of the first file: what shapes the numbers."""
    facts: dict[str, object] = {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    first = next(iter(files), None)
    if first is None:
        return facts
    try:
        st = os.stat(first)
        dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        facts["filesystem"] = filesystem_of(first)
        queue = Path(f"/sys/dev/block/{dev}").resolve()
        # A partition's queue/ lives on its parent disk.
        for base in (queue, queue.parent):
            if (base / "queue" / "read_ahead_kb").exists():
                facts["device"] = base.name
                for knob in ("read_ahead_kb", "max_sectors_kb", "nr_requests", "rotational"):
                    with contextlib.suppress(OSError, ValueError):
                        facts[knob] = int((base / "queue" / knob).read_text())
                break
    except OSError:
        pass
    return facts


def filesystem_of(path: str | os.PathLike[str]) -> str | None:
    """The filesystem type of the mount holding `path` (longest matching mount point)."""
    target = os.path.realpath(path)
    best, fstype = "", None
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        return None
    return fstype


def check_output_path(out: str | os.PathLike[str], model_dirs: Iterable[str | os.PathLike[str]]) -> Path:
    """Refuse a report path inside a model directory: the model is read, never written."""
    target = Path(os.path.realpath(out))
    for d in model_dirs:
        base = Path(os.path.realpath(d))
        if target == base or base in target.parents:
            raise BadInput(
                f"{out}: will not write into the model directory {d}", hint="write the report elsewhere"
            )
    _check_writable(out, target.parent)
    return target


def _check_writable(out: str | os.PathLike[str], parent: Path) -> None:
    """Find out before minutes of reading, not after, that the report cannot be written there."""
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    problem = None
    if not existing.is_dir():
        problem = f"{existing} is not a directory"
    elif existing == parent:  # try exactly what write_json_atomic will do
        try:
            fd, probe = tempfile.mkstemp(prefix=".prewarm-report-check.", dir=parent)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            problem = f"cannot create a file in {parent} ({exc.strerror or exc})"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"cannot create {parent} (no write permission in {existing})"
    if problem:
        raise BadInput(f"{out}: {problem}", hint="pick another --report path")


def write_json_atomic(path: str | os.PathLike[str], data: object) -> None:
    """Write to a temp file next to `path`, fsync, then rename: a reader never sees half a report."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
