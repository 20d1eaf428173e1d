"""The `sparkctl` command line.

Commands live in their own modules and are imported only when invoked, so `sparkctl list` does not
pay for importing docker, httpx or torch (the 0.5 s budget in the foundation issue).
"""

from __future__ import annotations

import importlib
import sys

import click

from sparkctl import __version__
from sparkctl.errors import SparkctlError

# command name -> "module:attribute" of a click.Command. Add a command by adding a line here.
COMMANDS: dict[str, str] = {
    "list": "sparkctl.commands.catalog:list_cmd",
    "show": "sparkctl.commands.catalog:show_cmd",
    "render": "sparkctl.commands.catalog:render_cmd",
    "validate": "sparkctl.commands.catalog:validate_cmd",
    "schema": "sparkctl.commands.catalog:schema_cmd",
    "doctor": "sparkctl.commands.doctor:doctor_cmd",
    "prewarm": "sparkctl.commands.prewarm:prewarm_cmd",
    "prepare": "sparkctl.commands.prepare:prepare_cmd",
    "up": "sparkctl.commands.lifecycle:up_cmd",
    "down": "sparkctl.commands.lifecycle:down_cmd",
    "status": "sparkctl.commands.lifecycle:status_cmd",
    "logs": "sparkctl.commands.lifecycle:logs_cmd",
    "chat": "sparkctl.commands.lifecycle:chat_cmd",
    "bench": "sparkctl.commands.bench:bench_cmd",
    "verify": "sparkctl.commands.verify:verify_cmd",
    "build": "sparkctl.commands.image:build_cmd",
    "image": "sparkctl.commands.image:image_group",
    "cluster": "sparkctl.commands.cluster:cluster_group",
    "sync": "sparkctl.commands.cluster:sync_cmd",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attr)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkctl")
def cli() -> None:
    """Serve large quantized language models on a DGX Spark with one command."""


_LINE_MAX = 400  # characters of one message line: a 5,000-character value is cut, not echoed whole


def _printable(message: str) -> str:
    """A message that may quote user text, kept to its own lines: a carriage return, a vertical tab or an
    escape sequence in a key or a value is shown escaped, not obeyed by the terminal. Newlines stay (a
    message lists further problems on indented lines); a line longer than _LINE_MAX keeps its start and
    end around a count of what was cut."""
    return "\n".join(_cut(_escaped(line)) for line in message.split("\n"))


def _escaped(line: str) -> str:
    return "".join(
        ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode() for ch in line
    )


def _cut(line: str) -> str:
    if len(line) <= _LINE_MAX:
        return line
    keep = _LINE_MAX // 2 - 20
    return f"{line[:keep]}...<{len(line) - 2 * keep:,} characters>...{line[-keep:]}"


def main(argv: list[str] | None = None) -> None:
    """Entry point: turn every SparkctlError into one line on stderr and its exit code."""
    try:
        rv = cli.main(args=argv, prog_name="sparkctl", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.UsageError as exc:  # a bad flag or argument: one line, like every other user error
        click.echo(f"error: {_printable(exc.format_message())}", err=True)
        command = exc.ctx.command_path if exc.ctx is not None else "sparkctl"
        click.echo(f"hint: {command} --help", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"error: {_printable(exc.format_message())}", err=True)
        sys.exit(exc.exit_code)
    except SparkctlError as exc:
        click.echo(f"error: {_printable(str(exc))}", err=True)
        if exc.hint:
            click.echo(f"hint: {_printable(exc.hint)}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)
