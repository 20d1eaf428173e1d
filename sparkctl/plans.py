"""Recipes as plans, for the commands that look without running: the plan of a recipe (with its overrides),
the validation record of each recipe file, and the local model directory a recipe names.

`show`, `render`, `validate`, `doctor RECIPE` and `prewarm RECIPE` only render these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkctl.errors import UserError
from sparkctl.recipe.overrides import Overrides


def load_and_plan(
    source: str,
    overrides: Overrides | Sequence[str] = (),
    *,
    model_path: str | None = None,
    check_memory: bool = True,
) -> tuple[Any, Any]:
    """(Recipe, Plan) of a recipe name or file with its overrides applied."""
    from sparkctl.planner import plan
    from sparkctl.recipe.overrides import load

    recipe = load(source, overrides)
    return recipe, plan(recipe, model_path=model_path, check_memory=check_memory)


def expand_dirs(sources: Sequence[str]) -> list[str]:
    """A directory stands for every .yaml/.yml file in it (e.g. `sparkctl validate recipes/`)."""
    out: list[str] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found = sorted(str(p) for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
            if not found:
                raise UserError(f"no .yaml files in {source}")
            out.extend(found)
        else:
            out.append(source)
    return out


def validation_records(sources: Sequence[str], sets: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One record per recipe (directories expanded): schema, flags and memory plan checked; `ok` False with
    the one-line error for an invalid one."""
    results: list[dict[str, Any]] = []
    for source in expand_dirs(sources):
        try:
            r, p = load_and_plan(source, sets)
        except UserError as exc:
            results.append(
                {
                    "source": source,
                    "ok": False,
                    "name": None,
                    "error": str(exc),
                    "warnings": [],
                    "memory": None,
                }
            )
            continue
        results.append(
            {
                "source": source,
                "ok": True,
                "name": r.name,
                "error": None,
                "warnings": list(p.warnings),
                "memory": dataclasses.asdict(p.memory) if p.memory else None,
            }
        )
    return results
