"""`list`, `show`, `render`, `validate` and `schema`: look at recipes and plans without running anything.

These must answer in well under half a second, so this module imports only click at import time;
pydantic, PyYAML and rich are imported inside the commands, and nothing here imports docker, httpx or
torch. Data goes to stdout, warnings and messages to stderr, so `--json` output can be piped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from sparkctl.errors import UserError

set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a recipe field (value parsed as YAML), e.g. --set serve.max_model_len=32768. Repeatable.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
model_path_option = click.option(
    "--model-path",
    type=click.Path(exists=True, file_okay=True, dir_okay=True),
    default=None,
    help="A local model directory to plan with (mounted into the container for docker recipes).",
)


def _stderr() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def _stdout() -> Any:
    """A console for data (no syntax highlighting of numbers and paths)."""
    from rich.console import Console

    return Console(highlight=False)


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same directory, then rename: a reader never sees half a file."""
    path = path.expanduser()
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UserError(f"cannot write {path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


def _emit(text: str, output: str | None) -> None:
    if output:
        _write_atomic(Path(output), text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


def _warn(plan: Any) -> None:
    if plan.warnings:
        err = _stderr()
        for w in plan.warnings:
            err.print(f"[yellow]warning:[/yellow] {w}", markup=True)


def _load_and_plan(recipe: str, overrides: Sequence[str], model_path: str | None, check: bool = True) -> Any:
    from sparkctl.planner import plan
    from sparkctl.recipe import load_recipe

    r = load_recipe(recipe, overrides)
    return r, plan(r, model_path=model_path, check_memory=check)


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
        click.echo(json.dumps([asdict(e) for e in entries], indent=2))
        return
    if not entries:
        click.echo("No recipes found.", err=True)
        return
    import sys

    from rich.table import Table

    piped = not sys.stdout.isatty()
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
    if piped:
        from rich.console import Console

        console = Console(highlight=False, width=100_000, no_color=True)
        with console.capture() as captured:
            console.print(table)
        click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))
    else:
        _stdout().print(table)


@click.command("show", short_help="Show a recipe, its command and its memory plan.")
@click.argument("recipe")
@set_option
@model_path_option
@json_option
@click.option("--no-check", is_flag=True, help="Show the plan even when it does not fit in memory.")
def show_cmd(
    recipe: str, overrides: tuple[str, ...], model_path: str | None, as_json: bool, no_check: bool
) -> None:
    """Show RECIPE resolved (extends and --set applied), the command `up` runs, and its memory plan."""
    from sparkctl.planner.render import plan_to_dict, render_shell

    r, p = _load_and_plan(recipe, overrides, model_path, check=not no_check)
    resolved = r.model_dump(mode="json", by_alias=True, exclude_none=True)
    if as_json:
        click.echo(json.dumps({"recipe": resolved, "plan": plan_to_dict(p)}, indent=2))
        return
    import yaml
    from rich.rule import Rule
    from rich.syntax import Syntax
    from rich.table import Table

    # blocks that cannot affect this recipe are left out of the human view (JSON keeps everything)
    if r.engine.name != "llama.cpp":
        resolved["serve"].pop("llama_cpp", None)
    if r.runtime != "docker":
        resolved.pop("container", None)
    if r.cluster.nodes == 1 and r.cluster.tensor_parallel == 1 and r.cluster.pipeline_parallel == 1:
        resolved.pop("cluster", None)
    out = _stdout()
    out.print(Rule(f"recipe {r.name}", align="left"))
    text = yaml.safe_dump(resolved, sort_keys=False, width=100, allow_unicode=True)
    if out.is_terminal:
        out.print(Syntax(text, "yaml", theme="ansi_dark", background_color="default", word_wrap=True))
    else:
        out.print(text, markup=False, highlight=False, soft_wrap=True, end="")
    out.print(Rule("command", align="left"))
    # soft_wrap: never insert line breaks into the command, so it stays copy-pasteable at any width
    out.print(render_shell(p), markup=False, highlight=False, soft_wrap=True, end="")
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
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write to a file.")
def render_cmd(
    recipe: str, fmt: str, overrides: tuple[str, ...], model_path: str | None, output: str | None
) -> None:
    """Print what `up RECIPE` would run, as a shell command, JSON, or a docker-compose file."""
    from sparkctl.planner.render import render

    _, p = _load_and_plan(recipe, overrides, model_path)
    text = render(p, fmt)
    _warn(p)
    _emit(text, output)


@click.command("validate", short_help="Check recipe files: schema, flags and memory.")
@click.argument("recipes", nargs=-1, required=True)
@set_option
@json_option
def validate_cmd(recipes: tuple[str, ...], overrides: tuple[str, ...], as_json: bool) -> None:
    """Check recipe files (or built-in names): schema, flags and memory plan. Exit 2 if any is invalid."""
    results = []
    for source in _expand_dirs(recipes):
        try:
            r, p = _load_and_plan(source, overrides, None)
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
    bad = [res for res in results if not res["ok"]]
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        for res in results:
            if res["ok"]:
                click.echo(f"ok: {res['source']} ({res['name']})")
                for w in res["warnings"]:
                    click.echo(f"  warning: {w}", err=True)
            else:
                click.echo(f"invalid: {res['error']}", err=True)
    if bad:
        raise UserError(f"{len(bad)} of {len(results)} recipe(s) invalid")


def _expand_dirs(sources: Sequence[str]) -> list[str]:
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


@click.command("schema", short_help="Print the recipe JSON Schema.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write to a file.")
def schema_cmd(output: str | None) -> None:
    """Print the recipe JSON Schema (point your editor's YAML language server at it)."""
    from sparkctl.recipe.schema import recipe_json_schema

    _emit(json.dumps(recipe_json_schema(), indent=2) + "\n", output)
