"""The verification record: one row per check, the verdict, and where it is kept.

A record is kept per recipe under the state directory (`verify/<recipe>.json`, the latest run) so that `bench`
can say which verification its numbers were taken under, `doctor` can say a pack was never verified, and the
next `verify` can name a module whose bytes changed since (the record keeps a digest of every tensor it read).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkctl import __version__
from sparkctl.paths import state_dir

SCHEMA_ID = "sparkctl-verify/1"

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class Failure:
    """One module (or file) that failed a check, and why, in one line."""

    module: str
    reason: str


@dataclass
class Check:
    """One row of the table: what was checked, how many, the worst error against its bound, the verdict."""

    layer: str  # pack | kernels | engine
    what: str
    checked: int = 0
    worst: float | None = None
    bound: float | None = None
    unit: str = ""  # what worst/bound measure ("rel L2", "|dlogprob|", ...)
    max_abs: float | None = None  # kernel rows: the largest |ours - reference| of any output element
    verdict: str = PASS
    failures: list[Failure] = field(default_factory=list)
    note: str = ""

    def fail(self, module: str, reason: str) -> None:
        self.failures.append(Failure(module, reason))
        self.verdict = FAIL

    def abs_error(self, ours: Any, reference: Any) -> None:
        """Keep the largest absolute difference of two tensors (any device) seen by this row."""
        d = (
            float((ours.detach().double().cpu() - reference.double().cpu()).abs().max())
            if reference.numel()
            else 0.0
        )
        if d != d:  # NaN
            d = float("inf")
        self.max_abs = d if self.max_abs is None else max(self.max_abs, d)

    def error(self, value: float, module: str, what: str = "") -> None:
        """Record one measured error; above the bound (or not finite) fails that module."""
        if self.worst is None or not value <= self.worst:
            self.worst = value
        if self.bound is not None and not value <= self.bound:
            self.fail(module, f"{what or self.unit} {value:.3g} > bound {self.bound:.3g}")


@dataclass
class VerifyRecord:
    recipe: str
    model_dir: str
    mode: str  # quick | full
    device: str
    checks: list[Check] = field(default_factory=list)
    bytes_read: int = 0
    pack_bytes: int = 0
    seconds: float = 0.0
    created_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    digests: dict[str, str] = field(default_factory=dict)
    schema: str = SCHEMA_ID
    sparkctl_version: str = __version__

    @property
    def ok(self) -> bool:
        return all(c.verdict != FAIL for c in self.checks)

    def failures(self) -> list[tuple[Check, Failure]]:
        return [(c, f) for c in self.checks for f in c.failures]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d

    def summary(self) -> dict[str, Any]:
        """What a bench record carries: which verification its numbers were taken under."""
        return {
            "recipe": self.recipe,
            "created_at": self.created_at,
            "mode": self.mode,
            "device": self.device,
            "ok": self.ok,
            "layers": sorted({c.layer for c in self.checks if c.verdict != SKIP}),
            "failed": [f"{c.what}: {f.module}" for c, f in self.failures()][:10],
            "model_dir": self.model_dir,
        }


def from_dict(d: dict[str, Any]) -> VerifyRecord:
    checks = [
        Check(**{**c, "failures": [Failure(**f) for f in c.get("failures", [])]}) for c in d.get("checks", [])
    ]
    keep = {k: v for k, v in d.items() if k in VerifyRecord.__dataclass_fields__ and k != "checks"}
    return VerifyRecord(**keep, checks=checks)


def record_path(recipe: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in recipe) or "model"
    return state_dir() / "verify" / f"{safe}.json"


def save(record: VerifyRecord) -> Path:
    """Keep the record (atomically) as the recipe's latest verification."""
    from sparkctl.atomic import write_atomic

    path = record_path(record.recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(record.to_dict(), indent=1) + "\n")


def latest(recipe: str) -> VerifyRecord | None:
    """The recipe's last kept verification, or None (never verified, or an unreadable record)."""
    path = record_path(recipe)
    try:
        return from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def bench_summary(recipe: str) -> dict[str, Any] | None:
    """For a bench record: the summary of the recipe's latest verification, or None (never verified)."""
    rec = latest(recipe)
    return rec.summary() if rec is not None else None
