"""Named benchmark grids; `arena-v2` is the Spark Arena v2 profile exactly.

Source: spark-arena/recipe-registry benchmarking/spark-arena-v2.yaml (framework llama-benchy):
depth x concurrency, pp 2048, tg 128, 3 runs, prefix caching on, run in its heat-aware schedule
(strategy bucket_43521_seed42) so the thermal state at each task matches the published table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sparkctl.errors import UserError

ARENA_V2_DEPTHS = (0, 4096, 8192, 16384, 32768, 65535, 100000)
ARENA_V2_CONCURRENCY = (1, 2, 5, 10)
ARENA_V2_SCHEDULE: tuple[tuple[int, int], ...] = (
    (8192, 5), (4096, 5), (8192, 10), (8192, 2), (4096, 2), (100000, 5), (100000, 2),
    (65535, 10), (65535, 1), (0, 1), (65535, 5), (32768, 2), (4096, 10), (16384, 1),
    (8192, 1), (32768, 5), (0, 10), (16384, 10), (32768, 1), (0, 5), (16384, 5),
    (100000, 1), (32768, 10), (16384, 2), (0, 2), (65535, 2), (4096, 1), (100000, 10),
)  # fmt: skip


@dataclass(frozen=True)
class Grid:
    name: str
    depths: tuple[int, ...]
    concurrency: tuple[int, ...]
    pp: int
    tg: int
    runs: int
    prefix_caching: bool
    schedule: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "depths": list(self.depths),
            "concurrency": list(self.concurrency),
            "pp": self.pp,
            "tg": self.tg,
            "runs": self.runs,
            "prefix_caching": self.prefix_caching,
            "schedule": [list(t) for t in self.schedule],
        }


ARENA_V2 = Grid(
    name="arena-v2",
    depths=ARENA_V2_DEPTHS,
    concurrency=ARENA_V2_CONCURRENCY,
    pp=2048,
    tg=128,
    runs=3,
    prefix_caching=True,
    schedule=ARENA_V2_SCHEDULE,
)
GRIDS = {"arena-v2": ARENA_V2}


def get_grid(
    name: str,
    *,
    depths: tuple[int, ...] | None = None,
    concurrency: tuple[int, ...] | None = None,
    pp: int | None = None,
    tg: int | None = None,
    runs: int | None = None,
) -> Grid:
    """A named grid, optionally narrowed (a scaled-down run for a small model or a quick look).

    Narrowing keeps the published task order: tasks outside the chosen depths/concurrency are
    dropped; depths or levels not in the profile are appended in sorted order. The record says the
    grid was modified, so a narrowed run is never mistaken for the published one.
    """
    if name not in GRIDS:
        raise UserError(f"unknown grid {name!r}", hint=f"known: {', '.join(GRIDS)}")
    g = GRIDS[name]
    if not any(v is not None for v in (depths, concurrency, pp, tg, runs)):
        return g
    ds = depths or g.depths
    cs = concurrency or g.concurrency
    sched = [t for t in g.schedule if t[0] in ds and t[1] in cs]
    sched += sorted((d, c) for d in ds for c in cs if (d, c) not in sched)
    return replace(
        g,
        name=f"{g.name} (modified)",
        depths=tuple(ds),
        concurrency=tuple(cs),
        pp=pp or g.pp,
        tg=tg or g.tg,
        runs=runs or g.runs,
        schedule=tuple(sched),
    )
