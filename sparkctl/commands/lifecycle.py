"""`sparkctl up | down | status | logs | chat`: the server life cycle at the command line.

The work is done by sparkctl.up (the pipeline) and sparkctl.servers (the records of running servers);
this module only parses options and renders through commands.output: progress and messages to stderr,
results (summary, table, JSON, log lines, chat text) to stdout, so `--json` output and `logs` can be piped.
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

from sparkctl.commands import output
from sparkctl.commands.options import json_option, port_option, runtime_option, set_option
from sparkctl.errors import RuntimeFailure, UserError


class RichReporter:
    """Stage lines with timings; while waiting for health, a live status line (or periodic lines in CI)."""

    def __init__(self) -> None:
        self.console = output.console(stderr=True)

    def step(self, name: str, detail: str, seconds: float | None = None) -> None:
        from rich.markup import escape

        took = f" [dim]({seconds:.1f}s)[/]" if seconds is not None and seconds >= 0.05 else ""
        self.console.print(f"[green]✓[/] [bold]{name:<8}[/] {escape(detail)}{took}")

    def warn(self, message: str) -> None:
        from rich.markup import escape

        self.console.print(f"[yellow]![/] {escape(message)}")

    def stage(self, name: str) -> None:
        """Each stage says what it did when it finishes (`step`); a start needs no line of its own."""

    @contextlib.contextmanager
    def building(self, image: str) -> Iterator[Callable[[Any], None]]:
        from sparkctl.commands.image import BuildProgress, print_failure
        from sparkctl.image.build import BuildFailed

        try:
            with BuildProgress() as progress:
                yield progress
        except BuildFailed as exc:
            print_failure(exc)
            raise

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
@set_option
@port_option
@runtime_option
@click.option("--offline", is_flag=True, help="Use only the local Hugging Face cache; never download.")
@click.option(
    "--dry-run", is_flag=True, help="Print the plan (command line, memory, load) and start nothing."
)
@click.option("--force", is_flag=True, help="Launch even when the memory plan says it does not fit.")
@click.option(
    "--nodes",
    metavar="HEAD,WORKER",
    default=None,
    help="Serve across these Sparks ([user@]host[:port], head first; localhost is this one) over SSH.",
)
@click.option("--no-smoke", is_flag=True, help="Skip the smoke-test chat completion after the health gate.")
@click.option(
    "--restart",
    is_flag=True,
    help="Stop the recipe's running server first (applies an edited recipe, new --set values or a new port).",
)
@click.option(
    "--expose",
    is_flag=True,
    help="Listen on every interface (serve.host 0.0.0.0) instead of 127.0.0.1; needs an API key or --no-auth.",
)
@click.option(
    "--api-key",
    metavar="generate|-",
    default=None,
    envvar="SPARKCTL_API_KEY",
    help="The key clients must send (Bearer): `generate` makes one, stores it 0600 and prints it once; `-` "
    "reads it from stdin; or set SPARKCTL_API_KEY. Never the key itself here: `ps` shows it to every user.",
)
@click.option("--no-auth", is_flag=True, help="Allow serving a non-loopback address without an API key.")
@click.option(
    "--persist",
    is_flag=True,
    help="Keep serving after a reboot (docker: restart policy unless-stopped; native: a systemd user unit; "
    "`down` removes it).",
)
@click.option(
    "--build", is_flag=True, help="Build the recipe's image first (sparkctl build; skipped when up to date)."
)
@click.option(
    "--verify",
    "verify_pack",
    is_flag=True,
    help="Once healthy, run `sparkctl verify --quick` on the pack against this server (exit 1 on a failure).",
)
@json_option
def up_cmd(
    recipe: str,
    sets: tuple[str, ...],
    port: int | None,
    runtime: str | None,
    offline: bool,
    dry_run: bool,
    force: bool,
    nodes: str | None,
    no_smoke: bool,
    restart: bool,
    expose: bool,
    api_key: str | None,
    no_auth: bool,
    persist: bool,
    build: bool,
    verify_pack: bool,
    as_json: bool,
) -> None:
    """Start RECIPE and wait until it serves a healthy OpenAI-compatible endpoint.

    Stages: validate, plan, dry-run, reconcile, doctor, ready, fetch, prepare, prewarm, launch, health,
    smoke, persist (printed as they go; a cluster skips the local model's). A failed or
    interrupted start stops what it started. Running it again for a healthy recipe just reports it
    (--restart stops it and starts it again).
    """
    from sparkctl.recipe.overrides import Overrides
    from sparkctl.server.health import StartupFailed
    from sparkctl.up import UpOptions, run_up

    if expose:
        sets = (*sets, "serve.host=0.0.0.0")
    api_key = _api_key_input(api_key)
    opts = UpOptions(
        recipe=recipe,
        overrides=Overrides(sets=sets, port=port, runtime=runtime),
        api_key=api_key,
        no_auth=no_auth,
        persist=persist,
        offline=offline,
        dry_run=dry_run,
        force=force,
        smoke=not no_smoke,
        restart=restart,
        build=build,
        nodes=nodes,
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
    verified = None
    if verify_pack and result.cluster is None:
        from sparkctl.commands import verify as verify_cmd

        verified = verify_cmd.verify_served(result)
    if as_json:
        output.json({**result.to_json(), **({"verification": verified.summary()} if verified else {})})
        if verified is not None:
            verify_cmd.exit_on_failure(verified)
        return
    _print_summary(result)
    if verified is not None:
        verify_cmd.render(verified, as_json=False)
        verify_cmd.exit_on_failure(verified)


def _api_key_input(value: str | None) -> str | None:
    """The key from SPARKCTL_API_KEY or stdin (`--api-key -`), `generate`, or None.

    A key written on the command line is refused: a process's argv is readable by every local user
    (`ps`, /proc/PID/cmdline) for as long as `up` runs, which is minutes for a big model.
    """
    if value is None:
        return None
    if value == "-":
        line = click.get_text_stream("stdin").readline(4096).strip()
        if not line:
            raise UserError(
                "--api-key -: stdin gave no key", hint='printf %s "$KEY" | sparkctl up ... --api-key -'
            )
        return line
    source = click.get_current_context().get_parameter_source("api_key")
    if value != "generate" and source is click.core.ParameterSource.COMMANDLINE:
        raise UserError(
            "--api-key KEY would put the key in this command line, which every local user can read (ps)",
            hint="pass it in the environment (SPARKCTL_API_KEY=...), on stdin (--api-key -), or in "
            "serve.api_key_file; --api-key generate makes one",
        )
    return value


def _print_dry_run(result: Any, as_json: bool) -> None:
    from sparkctl.planner.render import plan_to_dict, render

    plan = result.plan
    if as_json:
        payload = {"dry_run": True, "plan": plan_to_dict(plan)}
        if plan.cluster is not None:  # each node's part, as planned from its probe
            payload["cluster"] = plan.cluster.to_json()
        if result.unit is not None:
            payload["systemd_unit"] = {"path": result.unit[0], "text": result.unit[1]}
        output.json(payload)
        return
    output.text(render(plan, "shell"), nl=False)
    m = plan.model
    source = (
        f"hub {m.repo}@{m.revision or 'main'}"
        if m.repo
        else f"local {m.path}"
        if m.path
        else f"generated by {m.generate}"
    )
    output.text(f"# model: {source} ({m.format})")
    if m.prepare is not None:
        from sparkctl.prepare.report import prepare_lines

        output.text("# prepare:")
        for line in prepare_lines(m, deep=True):
            output.text(f"#   {line}")
    if plan.memory is not None:
        fits = "fits" if plan.memory.fits else "DOES NOT FIT"
        output.text(f"# memory: {fits}")
        for note in plan.memory.notes:
            output.text(f"#   {note}")
    output.text(
        f"# load: prewarm {plan.load.prewarm}, {plan.load.workers} workers, "
        f"evict after load: {'yes' if plan.load.evict_after_load else 'no'}"
    )
    output.text(
        f"# health: /health and /v1/models within {plan.health_timeout_s:.0f}s, then one chat completion"
    )
    if result.unit is not None:
        output.text(f"# --persist: systemd user unit {result.unit[0]} (enabled; `down` removes it):")
        for line in result.unit[1].splitlines():
            output.text(f"#   {line}".rstrip())
    output.text("# dry run: nothing was started")


def _print_summary(result: Any) -> None:
    s = result.state
    plan = result.plan
    url = f"{s.base_url}/v1"
    where = _where(s)
    if result.already_running:
        output.text(
            f"{plan.recipe_name} is already up: {url} (model {s.served_model_name}, {where}, up {_age(s.started_at)})"
        )
        return
    output.text(f"{plan.recipe_name} is up: {url}  model: {s.served_model_name}  ({plan.runtime}, {where})")
    launch = result.timings.get("health", 0.0) + result.timings.get("launch", 0.0)
    output.text(
        f"  healthy {result.seconds_to_healthy:.1f}s after `up` started (launch to healthy {launch:.1f}s)"
    )
    if result.smoke_reply is not None:
        output.text(f"  smoke test: {result.smoke_tokens} token(s): {_shorten(result.smoke_reply, 60)!r}")
    if result.api_key_generated:
        output.text(f"  api key: {result.api_key_generated}  (shown once; kept 0600 in {plan.api_key_file})")
    body = json.dumps({"model": s.served_model_name, "messages": [{"role": "user", "content": "Hello!"}]})
    output.text(f"  try:   sparkctl chat {plan.recipe_name}")
    auth = ""
    if plan.api_key_file:  # the key by reference: a summary that is pasted somewhere must not carry it
        auth = f' -H "Authorization: Bearer $(cut -d= -f2- {shlex.quote(plan.api_key_file)})"'
    output.text(
        f"         curl {url}/chat/completions -H 'Content-Type: application/json'{auth} -d {shlex.quote(body)}"
    )
    output.text(f"  logs:  sparkctl logs -f {plan.recipe_name}    stop: sparkctl down {plan.recipe_name}")


def _where(s: Any) -> str:
    """Where a server runs, for the summary: its container, its pid, or its nodes."""
    if s.nodes:
        return f"on {', '.join(n['address'] for n in s.nodes)} ({s.extra.get('executor', '')})"
    return f"container {s.container_name}" if s.container_name else f"pid {s.pid}"


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
    from sparkctl import servers

    results = servers.down(recipe, all_, timeout_s=timeout)
    if not results:
        output.text(f"{recipe} is not running" if recipe else "no sparkctl servers are running")
        return
    failures = [r for r in results if r.error is not None]
    for r in results:
        if r.error is not None:
            output.text(f"error: {output.shown(r.recipe)}: {output.shown(r.error, 600)}", err=True)
        else:
            where = f" on {r.nodes} node(s)" if r.nodes > 1 else ""
            output.text(
                f"stopped {output.shown(r.recipe)}{where}"
                + (f" ({output.shown(r.note, 600)})" if r.note else "")
            )
    if failures:
        raise RuntimeFailure(f"{len(failures)} of {len(results)} server(s) could not be stopped (see above)")


# -- status ------------------------------------------------------------------------------------------


@click.command("status", short_help="Show running servers: port, uptime, health, memory.")
@click.argument("recipe", required=False)
@json_option
def status_cmd(recipe: str | None, as_json: bool) -> None:
    """Show running servers: recipe, runtime, port, uptime, health (probed now) and memory."""
    from sparkctl import servers

    rows = servers.status_rows(recipe)
    for line in servers.damaged_records(recipe) + [
        f"{r['recipe']}: {r['error']}" for r in rows if r["error"]
    ]:
        output.warn(line)
    if recipe and not rows:
        servers.known_recipe(recipe)
    if as_json:
        output.json(rows)
        return
    if not rows:
        output.text(f"{recipe} is not running" if recipe else "no sparkctl servers are running")
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("RECIPE", "RUNTIME", "PORT", "UPTIME", "HEALTH", "MEMORY", "PID/CONTAINER", "URL"):
        table.add_column(col)
    colour = {
        "healthy": "green",
        "starting": "cyan",
        "unhealthy": "yellow",
        "stopped": "red",
        "orphaned": "red",
    }
    for r in rows:
        mem = r["memory_bytes"]
        table.add_row(  # a record is a file anyone of this user could have written: shown escaped
            output.cell(r["recipe"]),
            output.cell(r["runtime"]),
            str(r["port"]),
            _age(r["started_at"]),
            f"[{colour[r['health']]}]{r['health']}[/]",
            "-" if mem is None else f"{mem / (1 << 30):.2f} GiB",
            output.cell(r["container"] or str(r["pid"] or "-")),
            output.cell(f"{r['base_url']}/v1"),
        )
    output.table(table)
    across = [r for r in rows if r.get("nodes")]
    if across:
        _parts_table(across)


def _parts_table(rows: list[dict[str, Any]]) -> None:
    """One row per part on each node (Ray head/worker, server, headless rank) of a server across Sparks."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("RECIPE", "NODE", "PART", "STATE", "ID"):
        table.add_column(col)
    for r in rows:
        for p in r["nodes"]:
            state = "running" if p["running"] else "stopped"
            table.add_row(r["recipe"], p["node"], p["what"], state, p["id"][:12])
    output.table(table)


# -- logs --------------------------------------------------------------------------------------------


@click.command("logs", short_help="Print (or follow) a server's log.")
@click.argument("recipe")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing new lines until the server stops (Ctrl-C ends)."
)
@click.option("-n", "--tail", type=click.IntRange(min=0), default=None, help="Only the last N lines.")
def logs_cmd(recipe: str, follow: bool, tail: int | None) -> None:
    """Print the server log of RECIPE (also after a failed `up` or a `down`: the last log is kept)."""
    from sparkctl import servers

    lines = servers.log_lines(recipe, tail=tail, follow=follow)
    try:
        for line in lines:
            output.text(line)
    except BrokenPipeError:  # `sparkctl logs x | head`
        sys.stderr.close()
    except KeyboardInterrupt:
        return
    finally:  # a cluster follow ends its follower on every node now, not at interpreter exit
        close = getattr(lines, "close", None)
        if close is not None:
            close()


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
    from sparkctl import servers
    from sparkctl.server.auth import key_of
    from sparkctl.server.client import stream_chat

    st = servers.chat_target(recipe)
    t0 = time.monotonic()
    pieces = 0
    for piece in stream_chat(
        st.base_url,
        st.served_model_name,
        message,
        max_tokens=max_tokens,
        temperature=temperature,
        api_key=key_of(st.extra.get("api_key_file")),
    ):
        pieces += 1
        output.text(piece, nl=False)
        sys.stdout.flush()
    output.text()
    note = "" if pieces else " (the model ended its answer at once)"
    output.console(stderr=True).print(
        f"[dim]{pieces} chunk(s) in {time.monotonic() - t0:.2f}s from {st.base_url}/v1{note}[/]"
    )
