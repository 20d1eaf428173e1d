"""Summary statistics of repeated measurements: median, p90, mean, spread (after warm-up)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: Iterable[float | None]) -> dict[str, Any] | None:
    """n, median, p90, p99, mean, std (population), min, max and spread = (max-min)/median."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    med = statistics.median(xs)
    return {
        "n": len(xs),
        "median": med,
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
        "mean": statistics.fmean(xs),
        "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "max": max(xs),
        "spread": (max(xs) - min(xs)) / med if med else 0.0,
    }


def mean_std_values(values: Iterable[float | None]) -> dict[str, Any] | None:
    """llama-benchy's per-task metric shape: {mean, std, values}."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0, "values": xs}


def peak_rate(events: list[tuple[float, int]], window_s: float = 1.0) -> float | None:
    """Best sliding-window token rate (tokens per second) over (time, tokens) events."""
    if not events:
        return None
    ev = sorted(events)
    span = ev[-1][0] - ev[0][0]
    if span < window_s:  # shorter than one window: the whole run is the best estimate
        total = sum(k for _, k in ev)
        return total / span if span > 0 else None
    best = 0
    j = 0
    running = 0
    for i in range(len(ev)):
        running += ev[i][1]
        while ev[i][0] - ev[j][0] >= window_s:  # half-open window [t, t + 1 s)
            running -= ev[j][1]
            j += 1
        best = max(best, running)
    return best / window_s
