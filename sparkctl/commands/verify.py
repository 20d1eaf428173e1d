"""`sparkctl verify RECIPE`: parse, find the pack (and its running server), render the record.

The checks live in `sparkctl.verify`; this module resolves what the user named and draws the table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from sparkctl.commands import output
from sparkctl.commands.options import json_option, set_option
from sparkctl.errors import RuntimeFailure, UserError


@click.command("verify", short_help="Prove that a recipe's EXL3 pack is served exactly.")
@click.argument("recipe")
@click.option(
    "--quick",
    "mode",
    flag_value="quick",
    default=True,
    help="Check a sample of modules of every kind (reads a few GiB of a large pack). The default.",
)
@click.option(
    "--full", "mode", flag_value="full", help="Check every module and hash every shard (reads it all)."
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    help="Where the plugin's path runs: the GPU's kernels when there is one (auto), or the CPU path.",
)
@click.option(
    "--no-engine", is_flag=True, help="Skip the engine check even when a server of RECIPE is running."
)
@set_option
@json_option
def verify_cmd(
    recipe: str, mode: str, device: str, no_engine: bool, sets: tuple[str, ...], as_json: bool
) -> None:
    """Check RECIPE's pack: its files (shapes, K, codebooks, index, checksums), its modules through the
    plugin's path against the reference decoder, and, when its server runs, the engine's log-probs.

    RECIPE is a recipe name, a recipe YAML, or a model directory. Exit 1 names the first failing module.
    """
    from sparkctl.verify import records
    from sparkctl.verify.run import verify

    name, model_dir, target = _resolve(recipe, sets, engine=not no_engine)
    with _progress(as_json) as progress:
        record = verify(
            model_dir, name=name, full=mode == "full", device=device, server=target, progress=progress
        )
    try:
        kept = records.save(record)
    except OSError as exc:
        from sparkctl.errors import write_failure

        raise write_failure(records.record_path(name), exc) from None
    render(record, as_json=as_json, kept=kept)
    _exit_on_failure(record)


def render(record: Any, *, as_json: bool, kept: Path | None = None) -> None:
    """The table (what, checked, worst error, bound, verdict) and one line of totals; or the JSON record."""
    if as_json:
        d = record.to_dict()
        d.pop("digests", None)
        d["kept"] = str(kept) if kept else None
        output.json(d)
        return
    from rich.table import Table

    tbl = Table(title=f"verify {record.recipe} ({record.mode}) on {record.device}")
    for col in ("layer", "what", "checked", "worst error", "bound", "max |Δ|", "verdict", "note"):
        tbl.add_column(
            col, justify="right" if col in ("checked", "worst error", "bound", "max |Δ|") else "left"
        )
    style = {"pass": "green", "fail": "bold red", "skip": "dim"}
    for c in record.checks:
        worst = "" if c.worst is None else f"{c.worst:.3g}"
        bound = "" if c.bound is None else f"{c.bound:.3g}"
        unit = f" {c.unit}" if c.unit and c.worst is not None else ""
        note = c.note
        if c.failures:
            f = c.failures[0]
            note = f"{f.module}: {f.reason}" + (
                f" (+{len(c.failures) - 1} more)" if len(c.failures) > 1 else ""
            )
        tbl.add_row(
            c.layer,
            c.what,
            str(c.checked),
            worst + unit,
            bound,
            "" if c.max_abs is None else f"{c.max_abs:.3g}",
            f"[{style[c.verdict]}]{c.verdict.upper()}[/]",
            note,
        )
    output.table(tbl)
    output.text(
        f"read {_size(record.bytes_read)} of the pack's {_size(record.pack_bytes)} in {record.seconds:.1f} s; "
        f"{'PASS' if record.ok else 'FAIL'}" + (f"; kept in {kept}" if kept else "")
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _exit_on_failure(record: Any) -> None:
    from sparkctl.verify.run import failure_line

    if not record.ok:
        raise RuntimeFailure(
            failure_line(record), hint="see the table above; docs/verify.md says what each row proves"
        )


def _progress(as_json: bool) -> Any:
    """A spinner on stderr naming the module being checked (nothing with --json or off a terminal)."""
    import contextlib

    if as_json or not output.console(stderr=True).is_terminal:
        return contextlib.nullcontext(lambda _m: None)

    @contextlib.contextmanager
    def spin() -> Any:
        with output.console(stderr=True).status("verify") as status:
            yield lambda m: status.update(f"verify: {m}")

    return spin()


def _resolve(recipe: str, sets: tuple[str, ...], *, engine: bool) -> tuple[str, Path, Any]:
    """(record name, model directory, the running server to check or None) of what the user named."""
    path = Path(recipe).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"{recipe}: a directory but not a model directory (no config.json)")
        return (
            path.resolve().name if path.name != "model" else path.resolve().parent.name,
            path.resolve(),
            None,
        )
    from sparkctl.models.fetch import local_model_path, resolve_model
    from sparkctl.plans import load_and_plan

    _, plan = load_and_plan(recipe, sets, check_memory=False)
    if getattr(plan.model, "format", "exl3") != "exl3":
        raise UserError(f"{recipe}: its model is {plan.model.format}, not EXL3: verify checks EXL3 packs")
    model_dir = local_model_path(plan.model)
    if model_dir is None and plan.model.generate:
        model_dir = resolve_model(plan.model)  # a tiny generated model: made here, no network
    if model_dir is None:
        src = plan.model.repo or plan.model.path
        raise UserError(
            f"{recipe}: its model ({src}) is not on this machine yet", hint=f"sparkctl up {recipe} fetches it"
        )
    steps = getattr(plan.model, "prepare", None)
    if (
        steps is not None
    ):  # the engine serves the prepare overlay (fixed index/config), so that is what to check
        overlay = Path(steps.overlay)
        if not (overlay / "config.json").is_file():
            raise UserError(
                f"{recipe}: its pack is served from a prepared overlay that is not made yet",
                hint=f"sparkctl prepare {recipe} (or sparkctl up {recipe} --verify)",
            )
        model_dir = overlay
    return plan.recipe_name, Path(model_dir), _target(plan.recipe_name) if engine else None


def _target(name: str) -> Any:
    """The recipe's running, healthy server as an engine target, or None."""
    from sparkctl.server.auth import headers, key_of
    from sparkctl.server.client import probe_health
    from sparkctl.servers import find_state
    from sparkctl.verify.engine import EngineTarget

    st = find_state(name)
    if st is None or not probe_health(st.base_url, timeout_s=2.0):
        return None
    return EngineTarget(st.base_url, st.served_model_name, headers(key_of(st.extra.get("api_key_file"))))


def verify_served(result: Any) -> Any:
    """`up --verify`: the quick verification of the pack just brought up, against its server (kept as the
    recipe's record). The caller renders it and exits 1 on a failure; the server keeps running."""
    from sparkctl.server.auth import headers, key_of
    from sparkctl.verify import records
    from sparkctl.verify.engine import EngineTarget
    from sparkctl.verify.run import verify

    if result.dry_run or result.state is None or result.model_path is None:
        return None
    plan = result.plan
    target = EngineTarget(result.state.base_url, plan.served_model_name, headers(key_of(plan.api_key_file)))
    record = verify(Path(result.model_path), name=plan.recipe_name, server=target)
    try:
        records.save(record)
    except OSError as exc:
        from sparkctl.errors import write_failure

        raise write_failure(records.record_path(plan.recipe_name), exc) from None
    return record


def exit_on_failure(record: Any) -> None:
    """Exit 1 with the first failing module named (after the table was shown)."""
    _exit_on_failure(record)
