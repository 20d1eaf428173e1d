"""`sparkctl prewarm RECIPE|PATH`: warm, evict or measure a model's shards (see the prewarm package).

A PATH (a model directory or shard files) works on its own; a RECIPE name resolves to the model's
local directory through the recipe, the planner and the model cache, without downloading anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from prewarm.cli import execute, options_from, prewarm_options
from sparkctl.commands.options import set_option
from sparkctl.errors import RuntimeFailure, UserError


def _is_path(target: str) -> bool:
    p = Path(target).expanduser()
    if p.suffix in (".yaml", ".yml"):
        return False  # a recipe file
    return p.exists() or os.sep in target or target.startswith((".", "~"))


def resolve_targets(targets: tuple[str, ...], sets: tuple[str, ...]) -> tuple[list[str], int | None]:
    """Paths to warm and the recipe's `load.workers` (None for plain paths)."""
    if len(targets) > 1 or _is_path(targets[0]):
        if sets:
            raise UserError("--set applies to a recipe, not to paths")
        return [str(Path(t).expanduser()) for t in targets], None
    from sparkctl.up import locate_model  # the PREWARM_STAGES of `up`: validate, then the local model

    local, workers = locate_model(targets[0], sets)
    return [str(local)], workers


@click.command("prewarm", short_help="Warm, evict or measure a model's shards in the page cache.")
@click.argument("targets", nargs=-1, required=True, metavar="RECIPE|PATH...")
@set_option
@prewarm_options
def prewarm_cmd(targets: tuple[str, ...], sets: tuple[str, ...], **kwargs: Any) -> int:
    """Warm a model's shards into the page cache with parallel readers, or evict / measure them.

    \b
    sparkctl prewarm glm-5.3-flash            # warm the recipe's model, 8 workers
    sparkctl prewarm ~/models/m --cold --json # cold-read GiB/s, JSON report
    sparkctl prewarm ~/models/m --evict       # give the page cache back (no root)
    sparkctl prewarm ~/models/m --measure-disk
    """
    from prewarm.errors import PrewarmError

    paths, recipe_workers = resolve_targets(targets, sets)
    try:
        code = execute(paths, options_from(kwargs, default_workers=recipe_workers or 8))
    except PrewarmError as exc:
        cls = UserError if exc.exit_code == 2 else RuntimeFailure
        raise cls(str(exc), hint=exc.hint) from None
    ctx = click.get_current_context()
    ctx.exit(code)
    return code
