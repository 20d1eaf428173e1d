"""The prepare steps as lines for `show` and `up --dry-run`.

From the recipe alone, plus what is on this machine: `show` (which must stay fast and import nothing
heavy) reads the overlay's marker, if it was made; `up --dry-run` (`deep`) plans against the download
when it is already local, found without network access or writes.
"""

from __future__ import annotations

import json
from pathlib import Path

from sparkctl.errors import SparkctlError
from sparkctl.models.source import ModelSource


def prepare_lines(source: ModelSource, *, deep: bool = False) -> list[str]:
    if source.prepare is None:
        return []
    from sparkctl.prepare.plan import MARKER, describe_steps

    lines = describe_steps(source.prepare)
    if not deep:
        try:
            marker = json.loads((Path(source.prepare.overlay) / MARKER).read_text())
            made = [f"made from {marker['source']}:", *(f"  {s}" for s in marker["steps"])]
        except (OSError, ValueError, KeyError, TypeError):
            made = ["not made yet: `sparkctl prepare` or `up` makes it after the download"]
        return [*lines, *made]
    from sparkctl.models.fetch import local_model_path

    local = local_model_path(source)
    if local is None:
        return [*lines, "the exact changes are listed once the pack is downloaded"]
    from sparkctl.prepare.apply import is_current
    from sparkctl.prepare.plan import plan_prepare

    try:
        plan = plan_prepare(source.prepare, local)
    except SparkctlError as exc:
        return [*lines, f"cannot plan it for {local}: {exc}"]
    state = "up to date" if is_current(plan) else "to be made by `up` or `sparkctl prepare`"
    return [*lines, f"for {local} ({state}):", *(f"  {s}" for s in plan.steps)]
