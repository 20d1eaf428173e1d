"""`list`, `show`, `render`, `validate` and `schema`: look at recipes and plans without running anything.

These must answer in well under half a second, so this module imports only click at import time;
pydantic, PyYAML and rich are imported inside the commands, and nothing here imports docker, httpx or
torch. Data goes to stdout, warnings and messages to stderr, so `--json` output can be piped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

from sparkctl.commands import output
from sparkctl.commands.options import json_option, model_path_option, output_option, set_option
from sparkctl.errors import UserError


def _warn(plan: Any) -> None:
    for w in plan.warnings:
        output.warn(w)


def _load_and_plan(recipe: str, sets: Sequence[str], model_path: str | None, check: bool = True) -> Any:
    from sparkctl.plans import load_and_plan

    return load_and_plan(recipe, sets, model_path=model_path, check_memory=check)


def _size(n: int | None, estimate: bool = False) -> str:
    if not n:
        return "-"
    return f"{'~' if estimate else ''}{n / 1024**3:.1f} GiB"


@click.command("list", short_help="List the built-in recipes.")
@json_option
def list_cmd(as_json: bool) -> None:
    """List the built-in recipes: name, model, format, size, engine, runtime, description."""
    from dataclasses import asdict

    from sparkctl.recipe import list_recipes

    entries = list_recipes()
    if as_json:
        output.json([asdict(e) for e in entries])
        return
    if not entries:
        output.text("No recipes found.", err=True)
        return
    from rich.table import Table

    piped = not output.is_terminal()
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NAME", "MODEL", "FORMAT", "SIZE", "ENGINE", "RUNTIME"):
        table.add_column(col, no_wrap=True)
    if piped:  # one line per recipe, for grep and awk
        table.add_column("DESCRIPTION", no_wrap=True)
    else:
        table.add_column("DESCRIPTION", overflow="fold", ratio=1)
    for e in entries:
        if e.error:
            table.add_row(e.name, "", "", "", "", "", f"[red]invalid:[/red] {e.error}")
            continue
        fmt = e.format + (f" {e.quant}" if e.quant else "")
        runtime = (
            e.runtime + (f" x{e.nodes}" if e.nodes > 1 else "") + (" (cpu)" if e.device == "cpu" else "")
        )
        table.add_row(
            e.name, e.model, fmt, _size(e.size_bytes, e.size_is_estimate), e.engine, runtime, e.description
        )
    output.table(table)


@click.command("show", short_help="Show a recipe, its command and its memory plan.")
@click.argument("recipe")
@set_option
@model_path_option
@json_option
@click.option("--no-check", is_flag=True, help="Show the plan even when it does not fit in memory.")
def show_cmd(
    recipe: str, sets: tuple[str, ...], model_path: str | None, as_json: bool, no_check: bool
) -> None:
    """Show RECIPE resolved (extends and --set applied), the command `up` runs, and its memory plan."""
    from sparkctl.planner.render import plan_to_dict, render_shell

    r, p = _load_and_plan(recipe, sets, model_path, check=not no_check)
    resolved = r.model_dump(mode="json", by_alias=True, exclude_none=True)
    if as_json:
        output.json({"recipe": resolved, "plan": plan_to_dict(p)})
        return
    import yaml
    from rich.rule import Rule
    from rich.syntax import Syntax
    from rich.table import Table

    # blocks that cannot affect this recipe are left out of the human view (JSON keeps everything)
    if r.runtime != "docker":
        resolved.pop("container", None)
    if r.cluster.nodes == 1 and r.cluster.tensor_parallel == 1 and r.cluster.pipeline_parallel == 1:
        resolved.pop("cluster", None)
    out = output.console()
    out.print(Rule(f"recipe {r.name}", align="left"))
    text = yaml.safe_dump(resolved, sort_keys=False, width=100, allow_unicode=True)
    if out.is_terminal:
        out.print(Syntax(text, "yaml", theme="ansi_dark", background_color="default", word_wrap=True))
    else:
        out.print(text, markup=False, highlight=False, soft_wrap=True, end="")
    out.print(Rule("command", align="left"))
    # soft_wrap: never insert line breaks into the command, so it stays copy-pasteable at any width
    out.print(render_shell(p), markup=False, highlight=False, soft_wrap=True, end="")
    pins = r.engine.effective_pins()
    if pins:  # sparkctl/pins.py for this engine release + the recipe's engine.pins: what the image carries
        out.print(Rule("pins", align="left"))
        out.print("  " + "  ".join(f"{k} {v}" for k, v in pins.items()), markup=False, soft_wrap=True)
    if p.model.prepare is not None:
        from sparkctl.prepare.report import prepare_lines

        out.print(Rule("prepare", align="left"))
        for line in prepare_lines(p.model):
            out.print(
                f"  - {line}" if not line.startswith("  ") else f"    {line.strip()}",
                markup=False,
                soft_wrap=True,
            )
    out.print(Rule("memory plan", align="left"))
    out.print(_memory_table(p.memory, Table))
    for note in (*p.memory.notes, *p.notes):
        out.print(f"  - {note}", markup=False, soft_wrap=True)
    _warn(p)


def _memory_table(m: Any, table_cls: Callable[..., Any]) -> Any:
    from sparkctl.planner.memory import gib

    table = table_cls(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("pool", gib(m.total_bytes))
    table.add_row("engine budget", gib(m.budget_bytes))
    table.add_row("  weights", gib(m.weights_bytes))
    table.add_row("  runtime overhead", gib(m.runtime_overhead_bytes))
    table.add_row("  kv cache", gib(m.kv_cache_bytes))
    table.add_row("kv bytes / token", f"{m.kv_bytes_per_token:,}" if m.kv_bytes_per_token else "unknown")
    table.add_row("kv capacity (tokens)", f"{m.max_context_tokens:,}" if m.kv_bytes_per_token else "unknown")
    table.add_row("left outside the engine", gib(m.total_bytes - m.budget_bytes))
    table.add_row("fits", "[green]yes[/green]" if m.fits else "[red]no[/red]")
    return table


@click.command("render", short_help="Print what `up` would run: shell, json or compose.")
@click.argument("recipe")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["shell", "json", "compose"]),
    default="shell",
    show_default=True,
    help="shell: a copy-pasteable docker run / native command; json: the plan; compose: a docker-compose.yml.",
)
@set_option
@model_path_option
@output_option
def render_cmd(
    recipe: str, fmt: str, sets: tuple[str, ...], model_path: str | None, output_path: str | None
) -> None:
    """Print what `up RECIPE` would run, as a shell command, JSON, or a docker-compose file."""
    from sparkctl.planner.render import render

    _, p = _load_and_plan(recipe, sets, model_path)
    text = render(p, fmt)
    _warn(p)
    output.write_or_echo(text, output_path)


@click.command("validate", short_help="Check recipe files: schema, flags and memory.")
@click.argument("recipes", nargs=-1, required=True)
@set_option
@json_option
def validate_cmd(recipes: tuple[str, ...], sets: tuple[str, ...], as_json: bool) -> None:
    """Check recipe files (or built-in names): schema, flags and memory plan. Exit 2 if any is invalid."""
    from sparkctl.plans import validation_records

    results = validation_records(recipes, sets)
    bad = [res for res in results if not res["ok"]]
    if as_json:
        output.json(results)
    else:
        for res in results:
            if res["ok"]:
                output.text(f"ok: {res['source']} ({res['name']})")
                for w in res["warnings"]:
                    output.text(f"  warning: {w}", err=True)
            else:
                output.text(f"invalid: {res['error']}", err=True)
    if bad:
        raise UserError(f"{len(bad)} of {len(results)} recipe(s) invalid")


@click.command("schema", short_help="Print the recipe JSON Schema.")
@output_option
def schema_cmd(output_path: str | None) -> None:
    """Print the recipe JSON Schema (point your editor's YAML language server at it)."""
    import json

    from sparkctl.recipe.schema import recipe_json_schema

    output.write_or_echo(json.dumps(recipe_json_schema(), indent=2) + "\n", output_path)
