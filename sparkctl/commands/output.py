"""The one output sink of the CLI: data (tables, JSON, plain text) to stdout, messages to stderr.

Every command renders its records through these, so a table looks the same in `list`, `status` and
`doctor`, piped output is one unwrapped, uncoloured line per row (for grep and awk), and `--json` is the
same indented JSON everywhere. rich is imported on first use (`sparkctl --help` stays fast).
"""

from __future__ import annotations

import json as _json
import os
from pathlib import Path
from typing import Any

import click

from sparkctl.errors import UserError

# Off a terminal a table is as wide as its content (rich would squeeze it into 80 columns).
_PIPED_WIDTH = 100_000


def console(*, stderr: bool = False) -> Any:
    """A rich console for stdout (data) or stderr (progress, warnings): printed text is never wrapped
    (soft wrap), so a command line or a log line stays one line at any width; tables go through `table`."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def is_terminal() -> bool:
    return bool(console().is_terminal)


def json(data: Any) -> None:
    """`--json`: the record(s), indented, on stdout."""
    click.echo(_json.dumps(data, indent=2, default=str))


def text(line: str = "", *, nl: bool = True, err: bool = False) -> None:
    """Plain text, no markup (log lines, a command line, chat output)."""
    click.echo(line, nl=nl, err=err)


def cell(value: Any, limit: int = 80) -> str:
    """A value for a table cell or a message that came from a file (a state record, a process's
    environment): rich markup escaped, control characters shown escaped, cut to `limit` characters, so a
    forged record cannot restyle or rewrite the terminal."""
    from rich.markup import escape

    return escape(shown(value, limit))


def shown(value: Any, limit: int = 200) -> str:
    """Plain-text `cell`: control characters shown escaped, cut to `limit` characters (no markup to escape)."""
    raw = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in str(value))
    return raw if len(raw) <= limit else raw[: limit - 1] + "…"


def table(tbl: Any) -> None:
    """A rich Table on stdout; piped, one uncoloured line per row with no trailing blanks."""
    c = console()
    if c.is_terminal:
        c.print(tbl)
        return
    from rich.console import Console

    plain = Console(highlight=False, width=_PIPED_WIDTH, no_color=True)
    with plain.capture() as captured:
        plain.print(tbl)
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def rich(renderable: Any, **kwargs: Any) -> None:
    """Anything rich renders (a rule, syntax, markup text) on stdout."""
    console().print(renderable, **kwargs)


def warn(message: str) -> None:
    """A warning on stderr (markup-free: messages carry paths and brackets)."""
    from rich.markup import escape

    shown = "".join(
        ch if ch.isprintable() or ch == "\n" else ch.encode("unicode_escape").decode() for ch in message
    )
    console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(shown)}")


def write_or_echo(content: str, output: str | None) -> None:
    """`-o FILE` writes atomically (a reader never sees half a file) and says so on stderr; else stdout."""
    if not output:
        click.echo(content, nl=False)
        return
    from sparkctl.atomic import write_atomic

    path = Path(output).expanduser()
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UserError(f"cannot write {path}: directory {directory} does not exist")
    umask = os.umask(0)
    os.umask(umask)
    try:
        write_atomic(path, content, mode=0o666 & ~umask)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    click.echo(f"wrote {output}", err=True)
