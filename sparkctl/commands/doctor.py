"""`sparkctl doctor [RECIPE]`: is this host ready to serve (that recipe)? Exit 1 if any check fails."""

from __future__ import annotations

from typing import Any

import click

from sparkctl.commands import output
from sparkctl.commands.options import json_option, set_option


@click.command("doctor", short_help="Check the host (GPU, driver, Docker, memory, disk) for a recipe.")
@click.argument("recipe", required=False)
@set_option
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="CHECK",
    help="Run only this check (repeatable): arch, gpu, driver, docker, nvidia-runtime, image, memory, disk, llama.cpp, freetoken, hf-token.",
)
@click.option(
    "--bundle",
    "bundle_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a redacted .tar.gz for a bug report (host, checks, recipe, plan, states, log tails).",
)
@json_option
def doctor_cmd(
    recipe: str | None, sets: tuple[str, ...], only: tuple[str, ...], bundle_path: str | None, as_json: bool
) -> int:
    """Check the host: arch, GPU, driver/CUDA, Docker and the NVIDIA runtime, the recipe's image (present,
    labelled with the pinned versions), memory, disk, the llama.cpp and FreeToken engines, HF token.

    With RECIPE, the checks are scoped to what that recipe needs (its runtime, device, memory plan
    and model size); without it, a general check-up that says what is missing for a Spark recipe.
    """
    from sparkctl.doctor import run_checks
    from sparkctl.errors import UserError

    if bundle_path:
        from sparkctl.bundle import write_bundle

        written = write_bundle(bundle_path, recipe, sets)
        output.text(f"wrote {written} (secrets redacted; check it before you share it)", err=True)
        return 0

    the_plan = None
    if recipe:
        from sparkctl.plans import load_and_plan

        # a plan that cannot fit is reported by the memory check, as a fail
        _, the_plan = load_and_plan(recipe, sets, check_memory=False)
    elif sets:
        raise UserError("--set needs a RECIPE")
    checks = run_checks(the_plan, only=only or None)
    failed = any(c.status == "fail" for c in checks)
    if as_json:
        payload: dict[str, Any] = {
            "recipe": recipe,
            "ok": not failed,
            "checks": [c.to_dict() for c in checks],
        }
        output.json(payload)
    else:
        _table(checks, recipe)
    click.get_current_context().exit(1 if failed else 0)
    return 1 if failed else 0


def _table(checks: list[Any], recipe: str | None) -> None:
    from rich.table import Table

    style = {"pass": "green", "warn": "yellow", "fail": "bold red"}
    table = Table(title=f"sparkctl doctor{f' {recipe}' if recipe else ''}", show_lines=False)
    table.add_column("check", style="bold")
    table.add_column("status")
    table.add_column("detail")
    table.add_column("fix")
    for c in checks:
        table.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", c.detail, c.hint or "")
    output.table(table)
    fails = sum(c.status == "fail" for c in checks)
    warns = sum(c.status == "warn" for c in checks)
    output.text(f"{fails} failed, {warns} warning(s), {len(checks) - fails - warns} passed")
