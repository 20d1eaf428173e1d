"""`sparkctl doctor [RECIPE]`: is this host ready to serve (that recipe)? Exit 1 if any check fails."""

from __future__ import annotations

import json
from typing import Any

import click


@click.command("doctor", short_help="Check the host (GPU, driver, Docker, memory, disk) for a recipe.")
@click.argument("recipe", required=False)
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a recipe field.")
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="CHECK",
    help="Run only this check (repeatable): arch, gpu, driver, docker, nvidia-runtime, memory, disk, hf-token.",
)
@click.option("--json", "json_out", is_flag=True, help="Print the checks as JSON.")
def doctor_cmd(recipe: str | None, overrides: tuple[str, ...], only: tuple[str, ...], json_out: bool) -> int:
    """Check the host: arch, GPU, driver/CUDA, Docker and the NVIDIA runtime, memory, disk, HF token.

    With RECIPE, the checks are scoped to what that recipe needs (its runtime, device, memory plan
    and model size); without it, a general check-up that says what is missing for a Spark recipe.
    """
    from sparkctl.doctor import run_checks
    from sparkctl.errors import UserError

    the_plan = None
    if recipe:
        from sparkctl.planner import plan
        from sparkctl.recipe import load_recipe

        loaded = load_recipe(recipe, overrides)
        the_plan = plan(loaded, check_memory=False)  # doctor reports a plan that cannot fit, as a fail
    elif overrides:
        raise UserError("--set needs a RECIPE")
    checks = run_checks(the_plan, only=only or None)
    failed = any(c.status == "fail" for c in checks)
    if json_out:
        payload: dict[str, Any] = {
            "recipe": recipe,
            "ok": not failed,
            "checks": [c.to_dict() for c in checks],
        }
        click.echo(json.dumps(payload, indent=2))
    else:
        _table(checks, recipe)
    click.get_current_context().exit(1 if failed else 0)
    return 1 if failed else 0


def _table(checks: list[Any], recipe: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    style = {"pass": "green", "warn": "yellow", "fail": "bold red"}
    table = Table(title=f"sparkctl doctor{f' {recipe}' if recipe else ''}", show_lines=False)
    table.add_column("check", style="bold")
    table.add_column("status")
    table.add_column("detail")
    table.add_column("fix")
    for c in checks:
        table.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", c.detail, c.hint or "")
    console = Console()
    console.print(table)
    fails = sum(c.status == "fail" for c in checks)
    warns = sum(c.status == "warn" for c in checks)
    console.print(f"{fails} failed, {warns} warning(s), {len(checks) - fails - warns} passed")
