"""The prepare runtime: make (or reuse) the overlay a PreparePlan describes, or delete it.

The overlay is built in a temporary directory beside its final place and renamed into it, so a
directory at the overlay path is always complete; its marker records the plan's fingerprint, and a
second `prepare` (or `up`) with the same pack and steps reuses it without writing anything. Only
symlinks and the few generated files are written, all inside the overlay: the download is read, never
opened for writing. Deleting the overlay (`sparkctl prepare --remove`, or `rm -r`) undoes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.prepare.plan import MARKER, PreparePlan


@dataclass(frozen=True)
class PrepareResult:
    overlay: Path
    reused: bool  # the overlay was already current: nothing written
    steps: tuple[str, ...]

    def summary(self) -> str:
        verb = "reused" if self.reused else "made"
        return f"{verb} {self.overlay} ({'; '.join(self.steps)})"


def is_current(plan: PreparePlan) -> bool:
    """The overlay exists, was made from this exact plan, and every link still resolves."""
    try:
        marker = json.loads((plan.overlay / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("fingerprint") != plan.fingerprint:
        return False
    return all((plan.overlay / rel).exists() for rel, _ in plan.links)


def apply(plan: PreparePlan) -> PrepareResult:
    if is_current(plan):
        return PrepareResult(plan.overlay, True, plan.steps)
    parent = plan.overlay.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{plan.overlay.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise RuntimeFailure(f"cannot create the prepare overlay under {parent}: {exc}") from exc
    try:
        _fill(tmp, plan)
        _swap(tmp, plan.overlay)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise RuntimeFailure(f"cannot write the prepare overlay {plan.overlay}: {exc}") from exc
        raise
    return PrepareResult(plan.overlay, False, plan.steps)


def _fill(tmp: Path, plan: PreparePlan) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; containers and other users read the overlay
    for rel, target in plan.links:
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, dest)
    for rel, data in plan.writes.items():
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    marker = {
        "fingerprint": plan.fingerprint,
        "source": str(plan.source),
        "steps": list(plan.steps),
        "written": sorted(plan.writes),
    }
    (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _swap(tmp: Path, overlay: Path) -> None:
    """Rename the finished overlay into place; an outdated one is moved aside first, then deleted."""
    if overlay.exists() or overlay.is_symlink():
        if not (overlay / MARKER).exists():
            raise UserError(
                f"{overlay} exists but is not a sparkctl prepare overlay; not replacing it",
                hint="move it away, or point SPARKCTL_CACHE_DIR elsewhere",
            )
        old = Path(tempfile.mkdtemp(prefix=f".{overlay.name}.", suffix=".old", dir=overlay.parent))
        os.rename(overlay, old / "overlay")
        os.rename(tmp, overlay)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(tmp, overlay)
    except OSError:
        if not (overlay / MARKER).exists():  # a concurrent prepare finished first: keep its copy
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def remove(overlay: Path) -> bool:
    """Delete an overlay (only one sparkctl made: it has the marker); False when there was none."""
    if not overlay.exists() and not overlay.is_symlink():
        return False
    if not (overlay / MARKER).exists():
        raise UserError(f"{overlay} is not a sparkctl prepare overlay; not deleting it")
    shutil.rmtree(overlay)  # removes the links themselves, never what they point at
    with contextlib.suppress(OSError):
        overlay.parent.rmdir()  # the pack's folder, once its last overlay is gone
    return True
