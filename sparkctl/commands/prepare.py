"""`sparkctl prepare RECIPE`: make (or show, or remove) the overlay `up` serves a pack from.

The work is sparkctl.prepare's; this module parses options and renders through commands.output.
"""

from __future__ import annotations

from pathlib import Path

import click

from sparkctl.commands import output
from sparkctl.commands.options import json_option, set_option
from sparkctl.errors import UserError


@click.command("prepare", short_help="Make the overlay a pack needs before vLLM can load it.")
@click.argument("recipe")
@set_option
@click.option("--offline", is_flag=True, help="Use only the local Hugging Face cache; never download.")
@click.option("--dry-run", is_flag=True, help="Print what would be linked and written; write nothing.")
@click.option("--remove", is_flag=True, help="Delete the overlay (the download is not touched).")
@json_option
def prepare_cmd(
    recipe: str, sets: tuple[str, ...], offline: bool, dry_run: bool, remove: bool, as_json: bool
) -> None:
    """Prepare RECIPE's pack: link every downloaded file into an overlay and write the rewritten ones
    (regenerated safetensors index, config.json for the exl3 plugin, chat template), never editing the
    download. `up` does the same before it launches; running it again reuses a current overlay."""
    from sparkctl.plans import load_and_plan

    if remove and dry_run:
        raise UserError("give --remove or --dry-run, not both")
    _, p = load_and_plan(recipe, sets, check_memory=False)
    steps = p.model.prepare
    if steps is None:
        raise UserError(
            f"recipe {p.recipe_name} has no model.prepare steps: its pack is served as downloaded"
        )
    overlay = Path(steps.overlay)
    if remove:
        from sparkctl.prepare.apply import remove as remove_overlay

        gone = remove_overlay(overlay)
        if as_json:
            output.json({"overlay": str(overlay), "removed": gone})
        else:
            output.text(f"removed {overlay}" if gone else f"no overlay at {overlay}")
        return

    from sparkctl.models.fetch import resolve_weights
    from sparkctl.prepare import prepare_model

    model_dir, _ = resolve_weights(p.model, offline=offline)
    prep, result = prepare_model(p.model, model_dir, dry_run=dry_run)
    if as_json:
        output.json(
            {**prep.to_json(), "dry_run": dry_run, "reused": None if result is None else result.reused}
        )
        return
    if result is None:
        output.text(f"would make {prep.overlay}")
    elif result.reused:
        output.text(f"{prep.overlay} is up to date (nothing written)")
    else:
        output.text(f"made {prep.overlay}")
    for line in prep.steps:
        output.text(f"  - {line}")
