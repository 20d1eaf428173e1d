"""`sparkctl bench [RECIPE | --url URL]` and `sparkctl bench compare A.json B.json ...`.

Parses options and renders: sparkctl.bench.config assembles the run (recipe defaults, workloads, grid,
SLOs) and writes the files next to bench.json, sparkctl.bench.runner measures and returns the record.
Progress goes to stderr, the table (or --markdown / --json) to stdout, files under --out.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from sparkctl.commands import output
from sparkctl.commands.options import json_option, set_option
from sparkctl.errors import UserError

# options that say how to render, not what to measure (the rest make a bench.config.BenchRequest)
_RENDER_OPTIONS = ("markdown", "as_json", "no_html")


class _DefaultToRun(click.Group):
    """`sparkctl bench tiny` means `sparkctl bench run tiny`; `compare` is the one other verb."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not (args and (args[0] in self.commands or args[0] in ("-h", "--help"))):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("bench", cls=_DefaultToRun, short_help="Measure TTFT, decode tok/s and more on a server.")
def bench_cmd() -> None:
    """Benchmark a running OpenAI-compatible server (RECIPE or --url), or compare records.

    \b
    sparkctl bench RECIPE [options]      (same as: sparkctl bench run RECIPE)
    sparkctl bench --url URL --model M
    sparkctl bench compare A.json B.json
    """


@bench_cmd.command("run", short_help="Benchmark RECIPE (running, or --up) or --url.")
@click.argument("recipe", required=False)
@click.option(
    "--url", help="Benchmark this OpenAI-compatible server instead of a recipe (http://host:port[/v1])."
)
@click.option("--model", help="Served model name (default: the recipe's, or the only one served).")
@click.option(
    "--api-key",
    envvar="OPENAI_API_KEY",
    help="Bearer key for servers that require one: `-` reads it from stdin, or set OPENAI_API_KEY (a key "
    "written here is visible to every local user in `ps`).",
)
@click.option(
    "--api",
    type=click.Choice(["chat", "completions"]),
    default="chat",
    show_default=True,
    help="Endpoint: /v1/chat/completions or /v1/completions.",
)
@click.option("--up", "bring_up", is_flag=True, help="Start RECIPE first (sparkctl up) and stop it after.")
@set_option
@click.option(
    "--sweep", metavar="PATH=V1,V2,...", help="Restart RECIPE per value of a --set path and compare."
)
@click.option(
    "--workloads",
    "-w",
    help="Comma list of suite,followup,long,concurrency,grid [suite,followup,long,concurrency].",
)
@click.option("--grid", type=click.Choice(["arena-v2"]), help="Run a named grid (adds the grid workload).")
@click.option(
    "--profile",
    type=click.Choice(["t1", "arena-v2"]),
    help="Community protocol: t1 (llama-benchy 0.4.0 T1 grid) or arena-v2 (same as --grid arena-v2).",
)
@click.option(
    "--profile-set",
    multiple=True,
    metavar="KEY=V1,V2",
    help="Scale the t1 grid: prompts, outputs, depths, concurrency, runs. Repeatable.",
)
@click.option(
    "--resume",
    type=click.Path(path_type=Path),
    help="Complete an interrupted --profile t1 run from its bench.json (writes beside it).",
)
@click.option("--t2", is_flag=True, help="Also run tool-eval-bench (T2 tool calling) and record its score.")
@click.option("--grid-depths", help="Narrow the grid's context depths (comma list).")
@click.option("--grid-concurrency", help="Narrow the grid's concurrency levels (comma list).")
@click.option("--grid-pp", type=click.IntRange(1), help="Grid prompt tokens (arena-v2: 2048).")
@click.option("--grid-tg", type=click.IntRange(1), help="Grid output tokens (arena-v2: 128).")
@click.option("--grid-runs", type=click.IntRange(1), help="Grid runs per task (arena-v2: 3).")
@click.option(
    "--max-tokens",
    type=click.IntRange(1),
    help="Output tokens per request (recipe bench.max_tokens, else 128).",
)
@click.option(
    "--runs", type=click.IntRange(1), help="Measured repetitions per case (recipe bench.runs, else 3)."
)
@click.option(
    "--warmup", type=click.IntRange(0), help="Unmeasured warm-up requests (recipe bench.warmup, else 1)."
)
@click.option("--categories", help="Comma list of suite categories (default: all eight).")
@click.option("--concurrency", "levels", help="Concurrency levels (default 1,2,4,8).")
@click.option(
    "--requests", type=click.IntRange(1), help="Measured requests per concurrency level (default max(4c,16))."
)
@click.option(
    "--long-tokens", help="Long-prompt sizes in tokens (default: the model's context, at most 120000)."
)
@click.option("--followup-tokens", type=click.IntRange(8), help="Context tokens of the follow-up test.")
@click.option(
    "--slo",
    multiple=True,
    metavar="KEY=MS",
    help="Goodput SLO: ttft_ms, tpot_ms, e2e_ms or itl_ms. Repeatable.",
)
@click.option(
    "--tokenizer",
    type=click.Path(),
    help="tokenizer.json (or its folder) to count tokens when a server sends no usage.",
)
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path), help="Output folder [./sparkctl-bench/NAME-TIME]."
)
@click.option("--markdown", is_flag=True, help="Print a Markdown table instead of the terminal table.")
@json_option
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds per request.")
def run_cmd(**kw: Any) -> None:
    """Benchmark RECIPE's running server (or --url) and write bench.json + report.html.

    Metrics (exact definitions in the README and the record): TTFT to the first chunk with content,
    reasoning or tool-call text; output tokens from the server's usage; decode tok/s =
    (N-1)/(t_last-t_first); TPOT, ITL, prefill tok/s (checked against /metrics), e2e, goodput.
    Ctrl-C stops and keeps what was measured.
    """
    from sparkctl.bench.config import BenchRequest, bench_options, write_outputs
    from sparkctl.bench.runner import has_data, run

    kw["api_key"] = _api_key_input(kw["api_key"])
    opts = bench_options(BenchRequest(**{k: v for k, v in kw.items() if k not in _RENDER_OPTIONS}))
    from sparkctl.bench.progress import RichProgress

    err = _console(stderr=True)
    reporter = _up_reporter()
    with RichProgress(err) as progress:
        outcome = run(opts, progress=progress, up_reporter=reporter)
    rec = outcome.record
    if not has_data(rec) and outcome.stopped_by is not None:  # nothing measured: the error says it all
        if isinstance(outcome.stopped_by, KeyboardInterrupt):
            started = " (and stopped the server it had started)" if opts.up or opts.sweep else ""
            err.print(f"[yellow]![/] interrupted before anything was measured{started}")
            sys.exit(130)
        raise outcome.stopped_by
    paths = write_outputs(rec, outcome.json_path, html=not kw["no_html"])
    _render(rec, markdown=kw["markdown"], as_json=kw["as_json"])
    for p in paths:
        err.print(f"[dim]wrote[/] {p}")
    if rec["target"].get("recipe"):
        from rich.markup import escape

        from sparkctl.bench.report import verification_line

        err.print(f"[dim]{escape(verification_line(rec.get('verification'), rec['target']['recipe']))}[/]")
    if outcome.stopped_by is not None:
        if isinstance(outcome.stopped_by, KeyboardInterrupt):
            err.print("[yellow]interrupted: partial results kept[/]")
            sys.exit(130)
        exc = outcome.stopped_by
        err.print(f"[yellow]partial results kept in {outcome.json_path}[/]")
        raise exc


def _api_key_input(value: str | None) -> str | None:
    """`-`: the key from stdin. A key written on the command line still works (it may be a remote
    server's), but is said to be visible to every local user, as `docker login --password` does."""
    if value == "-":
        key = click.get_text_stream("stdin").readline(4096).strip()
        if not key:
            raise UserError("--api-key -: stdin gave no key")
        return key
    source = click.get_current_context().get_parameter_source("api_key")
    if value and source is click.core.ParameterSource.COMMANDLINE:
        output.warn(
            "--api-key on the command line is visible to every local user (ps); set OPENAI_API_KEY or pass --api-key - (stdin)"
        )
    return value


@bench_cmd.command(
    "boot", short_help="Cold start in stages, per load path (default, pre-warm, fast loaders)."
)
@click.argument("recipe")
@set_option
@click.option("--variants", help="Comma list of variants to run (default: all the installed vLLM offers).")
@click.option(
    "--repeat", type=click.IntRange(1), default=1, show_default=True, help="Starts per variant (medians)."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Output folder [./sparkctl-bench/RECIPE-boot-TIME].",
)
@json_option
def boot_cmd(
    recipe: str, sets: tuple[str, ...], variants: str | None, repeat: int, out_dir: Path | None, as_json: bool
) -> None:
    """Start RECIPE from a cold page cache once per load path and time each stage.

    launched -> port open -> weights loaded -> healthy -> first token, for the default loader, with
    pre-warm, and each alternative the installed vLLM offers (a path that refuses to start is kept
    with the engine's reason). Writes boot.json and boot.html; the fastest path is named.
    """
    from sparkctl.bench import boot
    from sparkctl.bench import record as records

    only = tuple(v.strip() for v in variants.split(",") if v.strip()) if variants else ()
    rec = boot.run(
        recipe, only=only, base_sets=sets, repeat=repeat, progress=_NoteProgress(_console(stderr=True))
    )
    paths = boot.write(rec, out_dir or records.default_out_dir(f"{recipe}-boot"))
    if as_json:
        output.json(rec)
    else:
        from rich.table import Table

        from sparkctl.bench.tables import BOOT_COLUMNS, boot_rows

        table = Table(title=f"sparkctl bench boot · {recipe} · fastest: {rec['fastest'] or '-'}")
        for c in BOOT_COLUMNS:
            table.add_column(c, justify="left" if c in ("variant", "cache", "note") else "right")
        for r in boot_rows(rec):
            table.add_row(*r)
        output.table(table)
    err = _console(stderr=True)
    for p in paths:
        err.print(f"[dim]wrote[/] {p}")


class _NoteProgress:
    def __init__(self, console: Any) -> None:
        self.console = console

    def note(self, message: str) -> None:
        self.console.print(f"[dim]… {message}[/]")


@bench_cmd.command("compare", short_help="Before -> after across bench records (or llama-benchy JSON).")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--markdown", is_flag=True, help="Print Markdown instead of the terminal table.")
@json_option
@click.option(
    "--html", "html_out", type=click.Path(path_type=Path), help="Also write an HTML comparison here."
)
def compare_cmd(files: tuple[Path, ...], markdown: bool, as_json: bool, html_out: Path | None) -> None:
    """Compare bench records: the first file (or a sweep's first variant) is the baseline."""
    from sparkctl.bench.compare import compare

    result = compare(list(files))
    if as_json:
        output.json(result)
    else:
        _render_compare(result, markdown=markdown)
    if html_out:
        from sparkctl.bench.config import write_compare_html

        _console(stderr=True).print(f"[dim]wrote[/] {write_compare_html(result, html_out)}")


# -- rendering ---------------------------------------------------------------------------------------


def _console(*, stderr: bool) -> Any:
    return output.console(stderr=stderr)


def _up_reporter() -> Any:
    try:
        from sparkctl.commands.lifecycle import RichReporter

        return RichReporter()
    except ImportError:  # the up core's default reporter prints nothing
        return None


def _render(rec: dict[str, Any], *, markdown: bool, as_json: bool) -> None:
    from sparkctl.bench import tables

    if as_json:
        output.json(rec)
        return
    if markdown:
        output.text(tables.markdown(rec), nl=False)
        return
    from rich.table import Table

    t = rec.get("target", {})
    table = Table(title=f"sparkctl bench · {t.get('recipe') or t.get('url')} · {t.get('model')}")
    for c in tables.COLUMNS:
        table.add_column(c, justify="left" if c in ("variant", "workload", "case") else "right")
    for r in tables.rows(rec):
        table.add_row(*r)
    output.table(table)
    g = tables.grid_rows(rec)
    if g:
        gt = Table(title="grid (llama-benchy fields)")
        for c in tables.GRID_COLUMNS:
            gt.add_column(c, justify="left" if c in ("variant", "test") else "right")
        for r in g:
            gt.add_row(*r)
        output.table(gt)


def _render_compare(result: dict[str, Any], *, markdown: bool) -> None:
    files = result["files"]
    head = ["variant", "workload", "case", "metric", files[0]] + [x for f in files[1:] for x in (f, "Δ%")]
    body = []
    for r in result["rows"]:
        cells = [r["variant"], r["workload"], r["case"], r["metric"], f"{r['base']:,.2f}"]
        for o in r["others"]:
            cells.append("-" if o["value"] is None else f"{o['value']:,.2f}")
            mark = "" if o["better"] is None else (" ▲" if o["better"] else " ▼")
            cells.append("-" if o["pct"] is None else f"{o['pct']:+.1f}%{mark}")
        body.append(cells)
    if markdown:
        output.text("| " + " | ".join(head) + " |")
        output.text("|" + "|".join("---" for _ in head) + "|")
        for c in body:
            output.text("| " + " | ".join(c) + " |")
        return
    from rich.table import Table

    table = Table(title="sparkctl bench compare (▲ better, ▼ worse)")
    for h in head:
        table.add_column(h, justify="left" if h in ("variant", "workload", "case", "metric") else "right")
    for c in body:
        table.add_row(*c)
    output.table(table)
