"""`python -m prewarm PATH...`: warm, evict, measure or inspect model shards from the shell.

`sparkctl prewarm` reuses `prewarm_options` and `execute`, adding recipe-name resolution; errors are
PrewarmError here and are turned into one `error:` line by whichever front end runs.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from prewarm.errors import BadInput, DoesNotFit, Interrupted, PrewarmError

GiB = 1 << 30
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'16M', '16MiB', '1.5G', '4096' -> bytes (binary units, as the reports print them)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise BadInput(f"{text!r} is not a size (examples: 4096, 16M, 1.5G)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


class _Size(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except BadInput as exc:
            self.fail(str(exc), param, ctx)


SIZE = _Size()


@dataclass
class Options:
    workers: int = 8
    chunk: int = 16 << 20
    method: str = "sendfile"
    mode: str = "warm"  # warm | cold | evict | measure-disk | status
    force: bool = False
    headroom: int | None = None
    json_out: bool = False
    report: str | None = None
    limit_rate: int | None = None
    progress: bool = True


def prewarm_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options both front ends share, so `python -m prewarm` and `sparkctl prewarm` agree."""
    decorators = [
        click.option(
            "-w",
            "--workers",
            type=click.IntRange(1, 256),
            default=None,
            help="Parallel readers [default: 8, or the recipe's load.workers].",
        ),
        click.option(
            "--chunk",
            type=SIZE,
            default="16M",
            show_default=True,
            help="Bytes per read (multiple of the page size).",
        ),
        click.option(
            "--method",
            type=click.Choice(["sendfile", "pread"]),
            default="sendfile",
            show_default=True,
            help="sendfile to /dev/null (fills the cache with no copy to user space), or pread into a reused buffer.",
        ),
        click.option(
            "--cold", "mode_cold", is_flag=True, help="Evict first, then warm: a cold-read measurement."
        ),
        click.option(
            "--evict",
            "mode_evict",
            is_flag=True,
            help="Drop the files from the page cache (posix_fadvise DONTNEED), verified with mincore.",
        ),
        click.option(
            "--measure-disk",
            "mode_measure_disk",
            is_flag=True,
            help="Parallel O_DIRECT reads: the device's ceiling (fills no cache).",
        ),
        click.option(
            "--status", "mode_status", is_flag=True, help="Only report page-cache residency per file."
        ),
        click.option(
            "--force", is_flag=True, help="Warm even if it leaves less than the headroom available."
        ),
        click.option(
            "--headroom",
            type=SIZE,
            default=None,
            help="Memory to keep available [default: max(8 GiB, 10 % of RAM)].",
        ),
        click.option(
            "--limit-rate",
            type=SIZE,
            default=None,
            help="Cap the read rate, bytes per second (e.g. 500M), to spare a busy disk.",
        ),
        click.option(
            "--json", "json_out", is_flag=True, help="Print the JSON report on stdout instead of a table."
        ),
        click.option(
            "--report",
            "report",
            type=click.Path(dir_okay=False),
            default=None,
            help="Also write the JSON report to this file (atomically).",
        ),
        click.option(
            "--no-progress",
            "progress",
            is_flag=True,
            flag_value=False,
            default=True,
            help="No live progress on stderr.",
        ),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


_MODES = {
    "mode_cold": "cold",
    "mode_evict": "evict",
    "mode_measure_disk": "measure-disk",
    "mode_status": "status",
}


def options_from(kwargs: dict[str, Any], *, default_workers: int = 8) -> Options:
    """Options from the click keyword arguments; at most one of --cold/--evict/--measure-disk/--status."""
    modes = [mode for key, mode in _MODES.items() if kwargs.get(key)]
    if len(modes) > 1:
        raise BadInput(f"choose one of --{' / --'.join(modes)}")
    return Options(
        workers=kwargs.get("workers") or default_workers,
        chunk=kwargs["chunk"],
        method=kwargs["method"],
        mode=modes[0] if modes else "warm",
        force=kwargs["force"],
        headroom=kwargs["headroom"],
        json_out=kwargs["json_out"],
        report=kwargs["report"],
        limit_rate=kwargs["limit_rate"],
        progress=kwargs["progress"],
    )


def execute(paths: Sequence[str | os.PathLike[str]], opts: Options) -> int:
    """Run one prewarm command; returns the exit code (0 ok, 1 a file failed or changed, 130 Ctrl-C).

    An OSError that escapes (a file removed or made unreadable between listing and reading, a report
    path that is a directory) becomes one line, never a traceback.
    """
    try:
        return _execute(paths, opts)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        cls = (
            BadInput
            if exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR)
            else PrewarmError
        )
        raise cls(f"{where}{exc.strerror or exc}") from None


def _execute(paths: Sequence[str | os.PathLike[str]], opts: Options) -> int:
    from prewarm.files import model_files
    from prewarm.report import check_output_path

    files = model_files(list(paths))
    model_dirs = {p if p.is_dir() else p.parent for p in map(Path, paths)} | {f.parent for f in files}
    if opts.report:
        check_output_path(opts.report, model_dirs)

    if opts.mode == "status":
        return _emit(_status(files), opts, code=0)
    if opts.mode == "evict":
        from prewarm.residency import evict

        ev = evict(files)
        return _emit(ev.to_dict(), opts, code=0)

    from prewarm.files import inspect_files
    from prewarm.progress import ProgressView
    from prewarm.warm import measure_disk, warm

    infos = inspect_files(files)  # bad input fails here, before the fit check and any reading
    total = sum(i.size for i in infos)
    fit_info = None
    if opts.mode in ("warm", "cold"):
        from prewarm.fit import fit_check
        from prewarm.residency import resident_bytes

        need = total if opts.mode == "cold" else total - sum(resident_bytes(i.path) for i in infos)
        fit = fit_check(need, headroom=opts.headroom)
        fit_info = fit.to_dict()
        if not fit.fits and not opts.force:
            raise DoesNotFit(fit.message, fit=fit, hint="free memory, lower --headroom, or pass --force")

    label = {"warm": "warming", "cold": "cold read", "measure-disk": "O_DIRECT"}[opts.mode]
    view = ProgressView(label, total, len(infos)) if opts.progress else None
    try:
        if view:
            view.__enter__()
        kwargs: dict[str, Any] = {
            "workers": opts.workers,
            "chunk_bytes": opts.chunk,
            "on_progress": view.update if view else None,
        }
        if opts.mode == "measure-disk":
            report = measure_disk(infos, **kwargs)
        else:
            report = warm(
                infos,
                method=opts.method,  # type: ignore[arg-type]
                cold=opts.mode == "cold",
                limit_rate=opts.limit_rate,
                **kwargs,
            )
    except Interrupted as exc:
        if view:
            view.__exit__(None, None, None)
            view = None
        data = exc.report.to_dict()
        data["fit"] = fit_info
        click.echo("interrupted: stopped the workers; partial report follows", err=True)
        return _emit(data, opts, code=130)
    finally:
        if view:
            view.__exit__(None, None, None)
    data = report.to_dict()
    data["fit"] = fit_info
    return _emit(data, opts, code=1 if report.failed else 0)


def _status(files: list[Path]) -> dict[str, Any]:
    from prewarm.residency import resident_bytes

    rows = []
    for f in files:
        size = f.stat().st_size
        res = resident_bytes(f)
        rows.append({"path": str(f), "bytes": size, "resident_bytes": res})
    total = sum(r["bytes"] for r in rows)
    resident = sum(r["resident_bytes"] for r in rows)
    return {
        "mode": "status",
        "total_bytes": total,
        "resident_bytes": resident,
        "residency": round(resident / total, 4) if total else 0.0,
        "files": rows,
    }


def _emit(data: dict[str, Any], opts: Options, *, code: int) -> int:
    """The report: JSON on stdout (`--json`), to a file (`--report`), and a readable summary."""
    if opts.report:
        from prewarm.errors import PrewarmError
        from prewarm.report import write_json_atomic

        try:
            write_json_atomic(opts.report, data)
        except OSError as exc:  # a full disk or a read-only directory: one line naming the file
            raise PrewarmError(
                f"cannot write the report {opts.report}: {exc.strerror or exc}",
                hint="free space there or pick another --report path; a previous report is left as it was",
            ) from None
    if opts.json_out:
        click.echo(json.dumps(data, indent=2))
    else:
        _summary(data)
    for w in data.get("warnings", []):
        click.echo(f"warning: {w}", err=True)
    for n in data.get("notes", []):
        click.echo(f"note: {n}", err=True)
    return code


def _summary(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    mode = data["mode"]
    table = Table(title=f"prewarm {mode}", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()

    def gib(n: Any) -> str:
        n = int(n)
        if n >= GiB // 10 or n == 0:
            return f"{n / GiB:.2f} GiB"
        return f"{n / 2**20:.1f} MiB"  # a small model: "0.00 GiB" would say nothing

    table.add_row("files", str(len(data["files"])))
    table.add_row("size", gib(data["total_bytes"]))
    if mode == "status":
        table.add_row("in page cache", f"{gib(data['resident_bytes'])} ({100 * data['residency']:.1f} %)")
    elif mode == "evict":
        table.add_row(
            "residency", f"{100 * data['residency_before']:.1f} % -> {100 * data['residency_after']:.1f} %"
        )
        table.add_row("seconds", f"{data['seconds']:.3f}")
    else:
        table.add_row(
            "read",
            f"{gib(data['bytes_read'])} in {data['seconds']:.2f} s with {data['workers']} workers ({data['method']})",
        )
        table.add_row("speed", f"{data['gib_per_s']:.2f} GiB/s ({data['gb_per_s']:.2f} GB/s)")
        table.add_row(
            "residency", f"{100 * data['residency_before']:.1f} % -> {100 * data['residency_after']:.1f} %"
        )
        if data.get("interrupted"):
            table.add_row("interrupted", "yes (partial)")
    console.print(table)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@prewarm_options
def main(paths: tuple[str, ...], **kwargs: Any) -> None:
    """Warm (or evict, or measure) model shards in PATHS: directories or files."""
    try:
        code = execute(paths, options_from(kwargs))
    except PrewarmError as exc:
        click.echo(f"error: {exc}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    sys.exit(code)
