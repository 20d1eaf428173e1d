"""`sparkctl up | down | status | logs | chat`: the server life cycle at the command line.

The work is done by sparkctl.up (the pipeline), the runtimes and sparkctl.server; this module only
parses options and renders: progress and messages to stderr, results (summary, table, JSON, log
lines, chat text) to stdout, so `--json` output and `logs` can be piped.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from sparkctl.errors import RuntimeFailure, UserError


def _console(*, stderr: bool) -> Any:
    """Rich console; off a terminal (CI logs, pipes) lines are not wrapped at 80 columns."""
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=stderr, highlight=False, width=250, soft_wrap=True)
    return console


def _stderr() -> Any:
    return _console(stderr=True)


class RichReporter:
    """Stage lines with timings; while waiting for health, a live status line (or periodic lines in CI)."""

    def __init__(self) -> None:
        self.console = _stderr()

    def step(self, name: str, detail: str, seconds: float | None = None) -> None:
        from rich.markup import escape

        took = f" [dim]({seconds:.1f}s)[/]" if seconds is not None and seconds >= 0.05 else ""
        self.console.print(f"[green]✓[/] [bold]{name:<8}[/] {escape(detail)}{took}")

    def warn(self, message: str) -> None:
        from rich.markup import escape

        self.console.print(f"[yellow]![/] {escape(message)}")

    @contextlib.contextmanager
    def waiting(self, label: str) -> Iterator[Callable[[Any], None]]:
        from rich.markup import escape

        if self.console.is_terminal:
            with self.console.status(f"starting {label}") as status:

                def live(tick: Any) -> None:
                    line = escape(_shorten(tick.last_line or "", 100))
                    status.update(
                        f"{tick.phase} {escape(label)} [dim]{tick.elapsed_s:4.0f}s[/]  [dim]{line}[/]"
                    )

                yield live
            return
        last_print = [0.0]

        def periodic(tick: Any) -> None:  # CI logs: one line every 10 s instead of a spinner
            if tick.elapsed_s - last_print[0] >= 10.0:
                last_print[0] = tick.elapsed_s
                self.console.print(
                    f"  … {tick.phase} {escape(label)} {tick.elapsed_s:.0f}s: {escape(_shorten(tick.last_line or '', 100))}"
                )

        yield periodic


def _shorten(text: str, n: int) -> str:
    text = text.strip()
    return text if len(text) <= n else text[: n - 1] + "…"


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM during `up` (a CI timeout, `kill`) cleans up like Ctrl-C instead of leaking the server."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- up ----------------------------------------------------------------------------------------------


@click.command("up", short_help="Start a recipe and wait until its endpoint is healthy.")
@click.argument("recipe")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a recipe field (value parsed as YAML). Repeatable.",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), help="Serve on this port (serve.port); 0 picks a free one."
)
@click.option("--runtime", type=click.Choice(["native", "docker"]), help="Override the recipe's runtime.")
@click.option("--offline", is_flag=True, help="Use only the local Hugging Face cache; never download.")
@click.option(
    "--dry-run", is_flag=True, help="Print the plan (command line, memory, load) and start nothing."
)
@click.option("--force", is_flag=True, help="Launch even when the memory plan says it does not fit.")
@click.option("--no-smoke", is_flag=True, help="Skip the smoke-test chat completion after the health gate.")
@click.option(
    "--restart",
    is_flag=True,
    help="Stop the recipe's running server first (applies an edited recipe, new --set values or a new port).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def up_cmd(
    recipe: str,
    overrides: tuple[str, ...],
    port: int | None,
    runtime: str | None,
    offline: bool,
    dry_run: bool,
    force: bool,
    no_smoke: bool,
    restart: bool,
    as_json: bool,
) -> None:
    """Start RECIPE and wait until it serves a healthy OpenAI-compatible endpoint.

    Stages: validate, doctor, image, fetch, memory, prewarm, launch, health, smoke. A failed or
    interrupted start stops what it started. Running it again for a healthy recipe just reports it
    (--restart stops it and starts it again).
    """
    from sparkctl.server.health import StartupFailed
    from sparkctl.up import UpOptions, run_up

    opts = UpOptions(
        recipe=recipe,
        overrides=overrides,
        port=port,
        runtime=runtime,
        offline=offline,
        dry_run=dry_run,
        force=force,
        smoke=not no_smoke,
        restart=restart,
    )
    reporter = RichReporter()
    try:
        with _sigterm_as_interrupt():
            result = run_up(opts, reporter)
    except StartupFailed as exc:
        if exc.log_tail:
            from rich.markup import escape

            reporter.console.print(f"[dim]--- last {len(exc.log_tail)} log lines ---[/]")
            for line in exc.log_tail:
                reporter.console.print(f"[dim]{escape(line)}[/]")
            reporter.console.print("[dim]---[/]")
        raise
    except KeyboardInterrupt:
        reporter.console.print("[yellow]![/] interrupted: stopped what this `up` had started")
        click.get_current_context().exit(130)  # said once; not click's extra "Aborted."

    if result.dry_run:
        _print_dry_run(result, as_json)
        return
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    _print_summary(result)


def _print_dry_run(result: Any, as_json: bool) -> None:
    from sparkctl.planner.render import plan_to_dict, render

    plan = result.plan
    if as_json:
        click.echo(json.dumps({"dry_run": True, "plan": plan_to_dict(plan)}, indent=2, default=str))
        return
    click.echo(render(plan, "shell"), nl=False)
    m = plan.model
    source = (
        f"hub {m.repo}@{m.revision or 'main'}"
        if m.repo
        else f"local {m.path}"
        if m.path
        else f"generated by {m.generate}"
    )
    click.echo(f"# model: {source} ({m.format})")
    if plan.memory is not None:
        fits = "fits" if plan.memory.fits else "DOES NOT FIT"
        click.echo(f"# memory: {fits}")
        for note in plan.memory.notes:
            click.echo(f"#   {note}")
    click.echo(
        f"# load: prewarm {plan.load.prewarm}, {plan.load.workers} workers, "
        f"evict after load: {'yes' if plan.load.evict_after_load else 'no'}"
    )
    click.echo(
        f"# health: /health and /v1/models within {plan.health_timeout_s:.0f}s, then one chat completion"
    )
    click.echo("# dry run: nothing was started")


def _print_summary(result: Any) -> None:
    s = result.state
    plan = result.plan
    url = f"{s.base_url}/v1"
    where = f"container {s.container_name}" if s.container_name else f"pid {s.pid}"
    if result.already_running:
        click.echo(
            f"{plan.recipe_name} is already up: {url} (model {s.served_model_name}, {where}, up {_age(s.started_at)})"
        )
        return
    click.echo(f"{plan.recipe_name} is up: {url}  model: {s.served_model_name}  ({plan.runtime}, {where})")
    launch = result.timings.get("health", 0.0) + result.timings.get("launch", 0.0)
    click.echo(
        f"  healthy {result.seconds_to_healthy:.1f}s after `up` started (launch to healthy {launch:.1f}s)"
    )
    if result.smoke_reply is not None:
        click.echo(f"  smoke test: {result.smoke_tokens} token(s): {_shorten(result.smoke_reply, 60)!r}")
    body = json.dumps({"model": s.served_model_name, "messages": [{"role": "user", "content": "Hello!"}]})
    click.echo(f"  try:   sparkctl chat {plan.recipe_name}")
    click.echo(
        f"         curl {url}/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"
    )
    click.echo(f"  logs:  sparkctl logs -f {plan.recipe_name}    stop: sparkctl down {plan.recipe_name}")


def _age(started_at: float) -> str:
    s = max(0, int(time.time() - started_at))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


# -- down --------------------------------------------------------------------------------------------


@click.command("down", short_help="Stop a server (or --all) and remove it.")
@click.argument("recipe", required=False)
@click.option("--all", "all_", is_flag=True, help="Stop every server sparkctl started.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for a clean exit (SIGTERM) before killing.",
)
def down_cmd(recipe: str | None, all_: bool, timeout: float) -> None:
    """Stop RECIPE (or --all) and remove its process or container. Stopping a stopped one is fine."""
    from sparkctl.runtimes import state as state_files
    from sparkctl.up import get_runtime

    if all_ and recipe:
        raise UserError("give a RECIPE or --all, not both")
    if all_:
        targets = state_files.load_all()
        if not targets:
            click.echo("no sparkctl servers are running")
            return
    elif recipe:
        found = _find_state(recipe)
        if found is None:
            _known_recipe(recipe)  # a typo must not read as "stopped"
            click.echo(f"{recipe} is not running")
            return
        targets = [found]
    else:
        raise UserError("name the recipe to stop, or use --all", hint="see what runs: sparkctl status")
    failures: list[RuntimeFailure] = []
    for st in targets:
        try:
            get_runtime(st.runtime).stop(st, timeout_s=timeout)
        except RuntimeFailure as exc:  # with --all, one unreachable server must not keep the others up
            if len(targets) == 1:
                raise
            click.echo(f"error: {st.recipe}: {exc}", err=True)
            failures.append(exc)
            continue
        state_files.remove(st.recipe)
        click.echo(f"stopped {st.recipe}")
    if failures:
        raise RuntimeFailure(f"{len(failures)} of {len(targets)} server(s) could not be stopped (see above)")


def _find_state(recipe: str) -> Any:
    """A recipe is named as in `up`: a built-in name, or a YAML path whose recipe name we resolve."""
    from sparkctl.runtimes import state as state_files

    found = state_files.load(recipe)
    if found is not None:
        return found
    name = _recipe_name(recipe)
    return state_files.load(name) if name != recipe else None


def _known_recipe(recipe: str) -> None:
    """Raise the loader's UserError (exit 2, with "did you mean") when RECIPE has never run here and is neither a
    built-in name nor an existing YAML file: `down`/`status` of a misspelt name answered "not running" and exit
    0, which a user (or a script) takes for "stopped". A name with a kept log ran here (`up my.yaml` runs the
    recipe named inside it), so stopping it again stays fine."""
    from sparkctl.runtimes import state as state_files

    if state_files.log_path(_recipe_name(recipe)).exists():
        return
    from sparkctl.recipe.loader import resolve_source

    resolve_source(recipe)


def _recipe_name(recipe: str) -> str:
    """The recipe name behind a YAML path (`up my.yaml` runs the recipe named inside it); a name as is."""
    if not (recipe.endswith((".yaml", ".yml")) or "/" in recipe):
        return recipe
    try:
        from sparkctl.recipe import load_recipe

        return str(load_recipe(recipe).name)
    except UserError:
        return recipe


def _ready_for_chat(st: Any) -> None:
    """Say why a server cannot answer (stopped, still starting) instead of a bare 'connection refused'."""
    from sparkctl.runtimes import state as state_files
    from sparkctl.server.client import probe_health
    from sparkctl.up import get_runtime

    if not get_runtime(st.runtime).is_running(st):
        raise UserError(
            f"{st.recipe} is not running: its server stopped",
            hint=f"see why: sparkctl logs {st.recipe}; start it again: sparkctl up {st.recipe}",
        )
    if state_files.is_starting(st.recipe) and not probe_health(st.base_url, timeout_s=2.0):
        raise RuntimeFailure(
            f"{st.recipe} is still starting",
            hint=f"wait for `sparkctl up {st.recipe}` to finish; follow it: sparkctl logs -f {st.recipe}",
        )


# -- status ------------------------------------------------------------------------------------------


def status_rows(recipe: str | None = None) -> list[dict[str, Any]]:
    """One record per recorded server, with a live health probe and its memory in use."""
    from sparkctl.runtimes import state as state_files
    from sparkctl.server.client import probe_health
    from sparkctl.up import get_runtime

    states = state_files.load_all()
    if recipe is not None:
        names = {recipe, _recipe_name(recipe)}
        states = [s for s in states if s.recipe in names]
    rows: list[dict[str, Any]] = []
    for st in states:
        try:
            rt = get_runtime(st.runtime)
            running = rt.is_running(st)
            stats = rt.stats(st) if running and hasattr(rt, "stats") else None
        except RuntimeFailure as exc:  # e.g. the Docker daemon went away
            running, stats = False, None
            err = str(exc)
        else:
            err = None
        if not running:
            health = "stopped"
        else:
            health = "healthy" if probe_health(st.base_url, timeout_s=2.0) else "unhealthy"
            if health == "unhealthy" and state_files.is_starting(st.recipe):
                health = "starting"  # an `up` is still waiting for it: not (yet) a problem
        rows.append(
            {
                "recipe": st.recipe,
                "runtime": st.runtime,
                "port": st.port,
                "base_url": st.base_url,
                "model": st.served_model_name,
                "pid": st.pid,
                "container": st.container_name,
                "started_at": st.started_at,
                "uptime_s": round(max(0.0, time.time() - st.started_at), 1),
                "health": health,
                "memory_bytes": (stats or {}).get("memory_bytes"),
                "log_path": st.log_path,
                "error": err,
            }
        )
    return rows


@click.command("status", short_help="Show running servers: port, uptime, health, memory.")
@click.argument("recipe", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of a table.")
def status_cmd(recipe: str | None, as_json: bool) -> None:
    """Show running servers: recipe, runtime, port, uptime, health (probed now) and memory."""
    rows = status_rows(recipe)
    if recipe and not rows:
        _known_recipe(recipe)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"{recipe} is not running" if recipe else "no sparkctl servers are running")
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("RECIPE", "RUNTIME", "PORT", "UPTIME", "HEALTH", "MEMORY", "PID/CONTAINER", "URL"):
        table.add_column(col)
    colour = {"healthy": "green", "starting": "cyan", "unhealthy": "yellow", "stopped": "red"}
    for r in rows:
        mem = r["memory_bytes"]
        table.add_row(
            r["recipe"],
            r["runtime"],
            str(r["port"]),
            _age(r["started_at"]),
            f"[{colour[r['health']]}]{r['health']}[/]",
            "-" if mem is None else f"{mem / (1 << 30):.2f} GiB",
            r["container"] or str(r["pid"] or "-"),
            f"{r['base_url']}/v1",
        )
    _console(stderr=False).print(table)


# -- logs --------------------------------------------------------------------------------------------


@click.command("logs", short_help="Print (or follow) a server's log.")
@click.argument("recipe")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing new lines until the server stops (Ctrl-C ends)."
)
@click.option("-n", "--tail", type=click.IntRange(min=0), default=None, help="Only the last N lines.")
def logs_cmd(recipe: str, follow: bool, tail: int | None) -> None:
    """Print the server log of RECIPE (also after a failed `up` or a `down`: the last log is kept)."""
    from sparkctl.runtimes import state as state_files
    from sparkctl.runtimes.native import follow_file
    from sparkctl.up import get_runtime

    st = _find_state(recipe)
    if st is not None:
        lines = get_runtime(st.runtime).logs(st, tail=tail, follow=follow)
    else:
        path = state_files.log_path(_recipe_name(recipe))
        if not path.exists():
            raise UserError(
                f"no logs for {recipe}: it is not running and has not run", hint="sparkctl status"
            )
        lines = follow_file(path, tail=tail)
    try:
        for line in lines:
            click.echo(line)
    except BrokenPipeError:  # `sparkctl logs x | head`
        sys.stderr.close()
    except KeyboardInterrupt:
        return


# -- chat --------------------------------------------------------------------------------------------


@click.command("chat", short_help="Send one chat message to a running server.")
@click.argument("recipe", required=False)
@click.option("-m", "--message", default="Hello! Who are you?", show_default=True, help="The user message.")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Most tokens in the answer.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=0.7,
    show_default=True,
    help="Sampling temperature; 0 is greedy (the same answer every time).",
)
def chat_cmd(recipe: str | None, message: str, max_tokens: int, temperature: float) -> None:
    """Send one chat message to a running server and stream the answer to stdout."""
    from sparkctl.runtimes import state as state_files
    from sparkctl.server.client import stream_chat

    if recipe is None:
        running = state_files.load_all()
        if len(running) != 1:
            names = ", ".join(s.recipe for s in running) or "none"
            raise UserError(f"name the recipe to chat with (running: {names})")
        st = running[0]
    else:
        st = _find_state(recipe)
        if st is None:
            raise UserError(f"{recipe} is not running", hint=f"start it: sparkctl up {recipe}")
    _ready_for_chat(st)
    t0 = time.monotonic()
    pieces = 0
    for piece in stream_chat(
        st.base_url, st.served_model_name, message, max_tokens=max_tokens, temperature=temperature
    ):
        pieces += 1
        click.echo(piece, nl=False)
        sys.stdout.flush()
    click.echo()
    note = "" if pieces else " (the model ended its answer at once)"
    _stderr().print(f"[dim]{pieces} chunk(s) in {time.monotonic() - t0:.2f}s from {st.base_url}/v1{note}[/]")
