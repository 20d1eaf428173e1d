"""`sparkctl build` and `sparkctl image ls / rm / save`: parse options, render the image core's records."""

from __future__ import annotations

import time
from typing import Any

import click

from sparkctl.commands import output
from sparkctl.commands.options import json_option, set_option


class BuildProgress:
    """Renders BuildEvents: on a terminal a live line (step, instruction, elapsed, last log line) and one
    line per finished step (cached or its time); piped, the finished-step lines only (CI logs)."""

    def __init__(self) -> None:
        self.console = output.console(stderr=True)
        self.step: Any = None
        self.started = time.monotonic()
        self.step_started = self.started
        self.cached = False
        self.last = ""
        self.status: Any = None
        self.last_note = self.started

    def __enter__(self) -> BuildProgress:
        if self.console.is_terminal:
            self.status = self.console.status("sending the build context")
            self.status.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self._finish()
        if self.status is not None:
            self.status.__exit__(*exc)

    def __call__(self, event: Any) -> None:
        if event.kind == "step":
            self._finish()
            self.step, self.step_started, self.cached, self.last = event, time.monotonic(), False, ""
        elif event.kind == "cached":
            self.cached = True
        else:
            self.last = event.text
        self._update()

    def _update(self) -> None:
        if self.step is None:
            return
        from rich.markup import escape

        s = self.step
        now = time.monotonic()
        if self.status is None:  # CI logs: a line every 30 s of a long step instead of a spinner
            if now - self.last_note >= 30:
                self.last_note = now
                self.console.print(
                    f"  … step {s.step}/{s.total} {now - self.step_started:.0f}s: {_short(self.last, 100)}",
                    markup=False,
                )
            return
        self.status.update(
            f"step {s.step}/{s.total} {escape(_short(s.text, 60))} [dim]{now - self.step_started:4.0f}s "
            f"(total {now - self.started:.0f}s)  {escape(_short(self.last, 80))}[/]"
        )

    def _finish(self) -> None:
        if self.step is None:
            return
        from rich.markup import escape

        s = self.step
        took = "[cyan]cached[/]" if self.cached else f"[dim]{time.monotonic() - self.step_started:.1f}s[/]"
        self.console.print(f"[green]✓[/] step {s.step:>2}/{s.total} {took:>6} {escape(_short(s.text, 90))}")
        self.step = None


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def run_build(recipe: Any | None, *, base: str | None, arch: str, nocache: bool, check: bool = False) -> Any:
    """Build the Spark image for `recipe`, rendering progress; a failed step prints its log tail, then raises."""
    from sparkctl.image.build import BuildFailed, build
    from sparkctl.image.spark import spark_spec
    from sparkctl.runtimes.docker import connect

    spec, _ = spark_spec(recipe, base=base, arch=arch)
    client = connect(timeout_s=30)
    if check:
        return build(spec, client, check_only=True)
    progress = BuildProgress()
    try:
        with progress:
            return build(spec, client, nocache=nocache, on_event=progress)
    except BuildFailed as exc:
        print_failure(exc)
        raise


def print_failure(exc: Any) -> None:
    """The failing Dockerfile line and the last lines of its output, before the one `error:` line."""
    err = output.console(stderr=True)
    if exc.step is not None:
        err.print(f"  Dockerfile line {exc.step.line}: {_short(exc.step.text, 200)}", markup=False)
    if exc.tail:
        err.print(f"  --- last {len(exc.tail)} lines of its output ---", markup=False, style="dim")
        for line in exc.tail:
            err.print(f"  {line}", markup=False, style="dim")


def _say_result(result: Any) -> None:
    err = output.console(stderr=True)
    from rich.markup import escape

    if result.built:
        cached = len(result.cached_steps)
        err.print(
            f"[green]✓[/] built {escape(result.tag)} in {result.seconds:.0f}s "
            f"({result.steps} steps, {cached} cached)"
        )
    else:
        err.print(f"[green]✓[/] {escape(result.tag)} is up to date (same inputs); not rebuilt")
    base = result.base.digest or result.base.id
    err.print(f"  base {escape(result.base.ref)} ({escape(base)})")
    if result.alias:
        err.print(f"  tagged {escape(result.alias)} (what the recipe runs)")


@click.command("build", short_help="Build the Spark serving image (vLLM + EXL3 kernels) for a recipe.")
@click.argument("recipe", required=False)
@set_option
@click.option("--base", metavar="IMAGE", help="Base image (default: docker/README.md, Choosing the base).")
@click.option("--arch", default="12.1", show_default=True, help="CUDA compute capability to compile for.")
@click.option("--no-cache", "nocache", is_flag=True, help="Rebuild every step, even when the inputs match.")
@click.option(
    "--check", is_flag=True, help="Build nothing: exit 0 if the image for these inputs exists, 1 if not."
)
@click.option(
    "--push", "registry", metavar="REGISTRY", help="Also push the image to REGISTRY (host[:port]/path)."
)
@json_option
def build_cmd(
    recipe: str | None,
    sets: tuple[str, ...],
    base: str | None,
    arch: str,
    nocache: bool,
    check: bool,
    registry: str | None,
    as_json: bool,
) -> None:
    """Build docker/Dockerfile for RECIPE (default: the default Spark recipe's image).

    The tag is a hash of every input (Dockerfile, kernel and sparkctl sources, pins, base image id), so
    an unchanged checkout reuses the image it built before and an edited one rebuilds only the layers
    after the change. The recipe's container.image is pointed at the result, so `sparkctl up` runs it.
    """
    from sparkctl.image.spark import DEFAULT_RECIPE
    from sparkctl.recipe.overrides import load

    r = load(recipe or DEFAULT_RECIPE, sets)
    result = run_build(r, base=base, arch=arch, nocache=nocache, check=check)
    if check:
        if as_json:
            output.json({**result.to_json(), "up_to_date": bool(result.image_id)})
        else:
            state = "up to date" if result.image_id else "not built yet (these inputs have no image)"
            output.text(f"{result.tag}: {state}")
        if not result.image_id:
            click.get_current_context().exit(1)
        return
    pushed = None
    if registry:
        from sparkctl.image.build import push
        from sparkctl.runtimes.docker import connect

        pushed = push(connect(timeout_s=30), result.tag, registry)
    if as_json:
        output.json({**result.to_json(), "pushed": pushed})
        return
    _say_result(result)
    if pushed:
        output.text(f"  pushed {pushed}", err=True)
    output.text(result.tag)


@click.group("image", short_help="List, remove or ship the images sparkctl built.")
def image_group() -> None:
    """The images `sparkctl build` made on this machine (labelled with their inputs hash)."""


@image_group.command("ls")
@json_option
def image_ls(as_json: bool) -> None:
    """List sparkctl-built images: tags, size, base, pins."""
    from rich.table import Table

    from sparkctl.image.store import list_images
    from sparkctl.runtimes.docker import connect

    rows = list_images(connect())
    if as_json:
        output.json([r.to_json() for r in rows])
        return
    if not rows:
        output.text("no sparkctl-built images (sparkctl build makes one)", err=True)
        return
    t = Table(box=None, pad_edge=False)
    for col in ("TAG", "ID", "CREATED", "SIZE", "BASE", "PINS"):
        t.add_column(col)
    for r in rows:
        pins = " ".join(f"{k}={v}" for k, v in r.pins.items() if k in ("vllm", "torch", "flashinfer"))
        t.add_row(
            ", ".join(r.tags) or "<none>",
            r.id[7:19],
            r.created[:19].replace("T", " "),
            f"{r.size / 2**30:.1f} GiB" if r.size >= 2**30 else f"{r.size / 2**20:.0f} MiB",
            r.base,
            pins,
        )
    output.table(t)


@image_group.command("rm")
@click.argument("images", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Remove even when a stopped container still refers to it.")
def image_rm(images: tuple[str, ...], force: bool) -> None:
    """Remove sparkctl-built IMAGES (tags or ids); other images are refused."""
    from sparkctl.image.store import remove
    from sparkctl.runtimes.docker import connect

    client = connect()
    for ref in images:
        for gone in remove(client, ref, force=force):
            output.text(f"removed {gone}", err=True)


@image_group.command("save")
@click.argument("image")
@click.option(
    "--to", "host", required=True, metavar="HOST", help="ssh destination ([user@]host) to load it on."
)
@click.option("--ssh", default="ssh", show_default=True, help="ssh command (with options) to reach HOST.")
def image_save(image: str, host: str, ssh: str) -> None:
    """Ship IMAGE to HOST: docker save | ssh HOST docker load, streamed (for the second Spark, offline boxes)."""
    from sparkctl.image.store import save_to_host
    from sparkctl.runtimes.docker import connect

    t0 = time.monotonic()
    sent = save_to_host(connect(timeout_s=60), image, host, ssh=ssh)
    output.text(
        f"loaded {image} on {host} ({sent / 2**30:.2f} GiB in {time.monotonic() - t0:.0f}s)", err=True
    )
