"""Can the host hold the bytes we are about to pull into the page cache, with headroom to spare?

MemAvailable (psutil), never MemFree or cudaMemGetInfo, which count reclaimable cache as used on a
unified-memory host. Page cache is charged to the cgroup that first reads it, so a container's
`memory.max` (v2) or `memory.limit_in_bytes` (v1) caps what we may warm even on a big host.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

GiB = 1 << 30
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-aligned LONG_MAX


@dataclass(frozen=True)
class MemoryStatus:
    total: int
    mem_available: int
    cgroup_limit: int | None  # None: no limit on this process's cgroup
    cgroup_usage: int | None
    cgroup_path: str | None

    @property
    def available(self) -> int:
        """What may still be used: MemAvailable, capped by what the cgroup limit leaves."""
        if self.cgroup_limit is None:
            return self.mem_available
        return max(0, min(self.mem_available, self.cgroup_limit - (self.cgroup_usage or 0)))


@dataclass(frozen=True)
class FitResult:
    need_bytes: int  # bytes not yet resident that warming would add to the cache
    available_bytes: int
    headroom_bytes: int
    fits: bool
    memory: MemoryStatus
    message: str

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["memory"]["available"] = self.memory.available
        return data


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _UNLIMITED else value


def cgroup_memory(
    proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup", root: str | os.PathLike[str] = "/sys/fs/cgroup"
) -> tuple[int | None, int | None, str | None]:
    """(limit, usage, cgroup dir) of this process's memory cgroup; (None, None, None) if unlimited.

    Looks at the process's own cgroup and, when that path is not visible (inside a container the
    namespace root is mounted at /sys/fs/cgroup), at the mount root itself.
    """
    root = Path(root)
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None, None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":  # cgroup v2 unified hierarchy
            names, bases = ("memory.max", "memory.current"), [root / rel, root]
        elif "memory" in controllers.split(","):
            names, bases = (
                ("memory.limit_in_bytes", "memory.usage_in_bytes"),
                [root / "memory" / rel, root / "memory"],
            )
        else:
            continue
        for base in bases:
            if (base / names[0]).exists():
                limit = _read_int(base / names[0])
                if limit is None:
                    break
                return limit, _read_int(base / names[1]), str(base)
    return None, None, None


def memory_status() -> MemoryStatus:
    import psutil  # imported here: `sparkctl doctor` and friends stay fast when they do not need it

    vm = psutil.virtual_memory()
    limit, usage, path = cgroup_memory()
    return MemoryStatus(vm.total, vm.available, limit, usage, path)


def default_headroom(total: int) -> int:
    """Keep max(8 GiB, 10 % of RAM) free: the OS, the server's own start-up and a margin."""
    return max(8 * GiB, total // 10)


def fit_check(
    need_bytes: int, *, headroom: int | None = None, memory: MemoryStatus | None = None
) -> FitResult:
    """Whether `need_bytes` more page cache leaves at least `headroom` available."""
    mem = memory or memory_status()
    room = default_headroom(mem.total) if headroom is None else headroom
    avail = mem.available
    fits = need_bytes + room <= avail
    where = (
        f"cgroup {mem.cgroup_path} limit"
        if mem.cgroup_limit is not None and avail < mem.mem_available
        else "MemAvailable"
    )
    if fits:
        message = f"{need_bytes / GiB:.2f} GiB to warm, {avail / GiB:.2f} GiB available ({where}), {room / GiB:.1f} GiB headroom kept"
    else:
        message = (
            f"warming {need_bytes / GiB:.2f} GiB would leave less than {room / GiB:.1f} GiB free: "
            f"only {avail / GiB:.2f} GiB available ({where})"
        )
    return FitResult(need_bytes, avail, room, fits, mem, message)
