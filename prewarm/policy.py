"""When `up` should warm before launch and evict after: one decision, made in one place.

`auto` warms only when the host can hold the shards with headroom *and* it is not a unified-memory
host where the warm cache would later compete with the server's own copy of the weights (the
loader briefly needs model + copy; on a 128 GB Spark a 90 GiB model cannot afford that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prewarm.fit import FitResult


@dataclass(frozen=True)
class LoadDecision:
    warm: bool
    evict_during_load: bool  # run an EvictionSteward until the server is ready
    reason: str


def decide(
    prewarm: Literal["auto", "always", "never"],
    *,
    fit: FitResult,
    unified: bool,
    evict_after_load: bool = True,
) -> LoadDecision:
    """The load plan for one `up`; `fit` is `fit_check(bytes not yet cached)` on this host."""
    evict = unified and evict_after_load
    if prewarm == "never":
        return LoadDecision(False, evict, "load.prewarm is never")
    if prewarm == "always":
        if not fit.fits:
            return LoadDecision(False, evict, f"load.prewarm is always, but {fit.message}")
        return LoadDecision(True, evict, "load.prewarm is always")
    if not fit.fits:
        return LoadDecision(False, evict, fit.message)
    if unified and 2 * fit.need_bytes + fit.headroom_bytes > fit.available_bytes:
        return LoadDecision(
            False,
            evict,
            "unified memory: the loader's copy of the weights plus a warm cache would not fit, so the "
            "shards are read by the server directly",
        )
    return LoadDecision(True, evict, fit.message)
