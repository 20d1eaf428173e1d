"""`sparkctl up`: from a recipe name to a healthy, smoke-tested OpenAI endpoint, one visible stage at a time.

`STAGES` is the pipeline, one `Stage` a step over one `UpContext`: validate, plan, dry-run (stops a dry
run), reconcile (already up? --restart stops it; port free?), doctor, ready (image / engine installed),
fetch, prepare (and the memory plan), prewarm, launch, health, smoke, persist. A request runs a subset
(`stages_for`: `--no-smoke` and `bench --up` skip smoke; `prewarm RECIPE` runs PREWARM_STAGES), and a
runtime without a capability skips the stages that need it (a cluster fetches nothing here).

Cheap checks come before expensive ones: a missing image or a taken port is reported before a model
download or a pre-warm of tens of GB. Once something is launched its state file is written at once,
and any failure after that (a health timeout, an early exit, Ctrl-C, SIGTERM) stops it and removes
the state file again, so a failed `up` leaves nothing behind.

This module returns records and reports progress through a `Reporter`; it never prints, so the
command can render for a terminal, for CI logs or as JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkctl.errors import RuntimeFailure, UserError, write_failure
from sparkctl.planner.types import Plan
from sparkctl.recipe.overrides import Overrides
from sparkctl.runtimes import state as state_files
from sparkctl.runtimes.base import (
    API_KEY,
    LOCAL_MODEL,
    PERSIST,
    WATCHDOG,
    Runtime,
    ServerState,
    check_capabilities,
)
from sparkctl.runtimes.registry import get_runtime
from sparkctl.server.health import Tick, smoke_test, wait_healthy


class Reporter:
    """Progress sink for the pipeline; the default does nothing (library use, tests)."""

    def step(self, name: str, detail: str, seconds: float | None = None) -> None:
        """A stage finished."""

    def warn(self, message: str) -> None:
        """Something the user should know that does not stop `up`."""

    def stage(self, name: str) -> None:
        """A stage starts (each then reports its own `step` lines as it finishes)."""

    @contextlib.contextmanager
    def waiting(self, label: str) -> Iterator[Callable[[Tick], None]]:
        """Context for the health wait; yields the callback that receives each poll's Tick."""
        yield lambda tick: None

    @contextlib.contextmanager
    def building(self, image: str) -> Iterator[Callable[[Any], None]]:
        """Context for `up --build`; yields the callback that receives each image BuildEvent."""
        yield lambda event: None


@dataclass
class UpOptions:
    recipe: str
    overrides: Overrides = field(default_factory=Overrides)  # --set, --port (0: any free), --runtime
    offline: bool = False
    dry_run: bool = False
    force: bool = False  # go on when the memory plan says it does not fit
    smoke: bool = True
    restart: bool = False  # stop the recipe's running server first (to apply an edited recipe)
    persist: bool = False  # survive a reboot: docker restart policy unless-stopped, native a systemd unit
    api_key: str | None = None  # a key clients must send, or "generate" (a new one, printed once)
    no_auth: bool = False  # serve a non-loopback host without a key (refused otherwise)
    build: bool = False  # build the recipe's image first (`sparkctl build`; a no-op when up to date)
    nodes: str | None = None  # --nodes HEAD,WORKER: serve across these Sparks (else cluster.hosts)
    serve: bool = True  # False: a subset that serves nothing (prewarm RECIPE): no key or unit to check


@dataclass
class UpResult:
    plan: Plan
    state: ServerState | None = None  # None for a dry run
    already_running: bool = False
    dry_run: bool = False
    model_path: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    seconds_to_healthy: float | None = None  # from the start of `up` to a healthy endpoint
    smoke_reply: str | None = None
    smoke_tokens: int | None = None
    notes: list[str] = field(default_factory=list)
    api_key_generated: str | None = (
        None  # the new key of `--api-key generate`: shown once, then only in its file
    )
    cluster: Any = None  # a cluster.plan.ClusterPlan when serving across nodes
    unit: tuple[str, str] | None = None  # `--persist`, native: (path, text) of its systemd user unit
    stages: list[str] = field(default_factory=list)  # the stages this `up` ran, in order

    def to_json(self) -> dict[str, Any]:
        s = self.state
        return {
            "recipe": self.plan.recipe_name,
            "runtime": self.plan.runtime,
            "base_url": s.base_url if s else self.plan.base_url,
            "openai_base_url": f"{s.base_url if s else self.plan.base_url}/v1",
            "model": self.plan.served_model_name,
            "port": self.plan.port,
            "pid": s.pid if s else None,
            "container": s.container_name if s else None,
            "log_path": s.log_path if s else None,
            "already_running": self.already_running,
            "dry_run": self.dry_run,
            "model_path": str(self.model_path) if self.model_path else None,
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
            "seconds_to_healthy": None
            if self.seconds_to_healthy is None
            else round(self.seconds_to_healthy, 2),
            "smoke_reply": self.smoke_reply,
            "smoke_tokens": self.smoke_tokens,
            "notes": self.notes,
            "api_key_file": self.plan.api_key_file,
            "api_key": self.api_key_generated,  # only a key made by this `up`; null otherwise
            "cluster": self.cluster.to_json() if self.cluster is not None else None,
            "systemd_unit": self.unit[0] if self.unit else None,
            "stages": self.stages,
        }


def doctor_checks_for(plan: Plan) -> list[str]:
    """Only the checks this launch depends on: a CPU-only native server needs no GPU or Docker."""
    from sparkctl.doctor import needs_of
    from sparkctl.planner.adapters import adapter_for

    needs = needs_of(plan)
    names = ["memory", "disk"]
    if needs.docker:
        names.append("docker")
    if needs.gpu:
        names += ["gpu", "driver"]
    if needs.gpu_container:
        names.append("nvidia-runtime")
    if needs.token:
        names.append("hf-token")
    check = adapter_for(plan.engine).doctor_check
    if check is not None and plan.container is None:
        names.append(check)  # the binary/venv sparkctl installs natively, its build, CUDA where needed
    return names


# -- the pipeline: a list of stages over one context -------------------------------------------------


@dataclass
class UpContext:
    """Everything the stages share: the request, what each stage found, and what must be undone when a
    later one fails. One object instead of state threaded through positional parameters."""

    opts: UpOptions
    rep: Reporter
    t_start: float = field(default_factory=time.monotonic)
    timings: dict[str, float] = field(default_factory=dict)
    recipe: Any = None
    plan: Plan = None  # type: ignore[assignment]  # set by `validate`
    planned_with: Path | None = None  # the model directory the plan was made with (None: not here yet)
    across: bool = False  # served across nodes (--nodes or the recipe's cluster.hosts)
    key: str | None = None  # a new API key to store before launch
    key_stored: bool = False
    unit: tuple[str, str] | None = None  # `--persist`: (path, text) of what keeps it across reboots
    runtime: Runtime = None  # type: ignore[assignment]  # set by `validate`
    model_path: Path | None = None
    files: list[Path] = field(default_factory=list)
    steward: Any = None  # the page-cache steward watching the load
    log_path: Path | None = None
    server: ServerState | None = None
    result: UpResult | None = None  # made by `health` (or by a stage that ends the run early)
    done: bool = False  # a stage ended the run early (dry run, already up)
    ran: list[str] = field(default_factory=list)  # the stages run, in order

    def finish(self, *, done: bool = True, **kw: Any) -> UpResult:
        """The result: `done` ends the run here (dry run, already up); `health` makes it and goes on."""
        cluster = self.plan.cluster if self.plan is not None else None
        self.result = UpResult(plan=self.plan, timings=self.timings, cluster=cluster, **kw)
        self.done = done
        return self.result


@dataclass(frozen=True)
class Stage:
    """One step of `up`; `needs` names a runtime capability without which the stage has nothing to do
    (a cluster fetches, prepares and pre-warms nothing here: the preflight checked each node has it)."""

    name: str
    run: Callable[[UpContext], None]
    needs: str | None = None
    locked: bool = False  # runs holding the recipe's start lock (from reconcile on)


def _stage_validate(ctx: UpContext) -> None:
    opts, t = ctx.opts, time.monotonic()
    ctx.recipe = _load(opts)
    ctx.planned_with = _already_local(ctx.recipe)
    ctx.plan = _plan(ctx.recipe, ctx.planned_with, opts)
    ctx.across = opts.nodes is not None or (ctx.recipe.cluster.nodes > 1 and bool(ctx.recipe.cluster.hosts))
    ctx.runtime = get_runtime("cluster" if ctx.across else ctx.plan.runtime)
    if not opts.serve:
        return  # a subset that serves nothing (prewarm): no key or persistence to check
    ctx.key = _api_key(ctx.recipe, ctx.plan, opts)
    _warn_if_open(ctx.plan, ctx.key, ctx.rep)
    needed = [PERSIST] if opts.persist else []
    if ctx.key is not None or ctx.plan.api_key_file:
        needed.append(API_KEY)
    check_capabilities(ctx.runtime, needed, {PERSIST: "--persist", API_KEY: "an API key"})
    if opts.persist:  # rendered now, so a value a unit cannot hold is refused before anything starts
        ctx.unit = ctx.runtime.persistence(
            ctx.plan, state_files.log_path(ctx.plan.recipe_name), install=False, strict=not opts.dry_run
        )
    ctx.timings["validate"] = time.monotonic() - t
    p = ctx.plan
    ctx.rep.step(
        "validate",
        f"recipe {p.recipe_name} ({p.runtime}, {p.engine}) -> {p.base_url}",
        ctx.timings["validate"],
    )


def _stage_plan(ctx: UpContext) -> None:
    """Where it runs: across nodes, each node's part planned from its probe (the preflight)."""
    if ctx.across:
        plan = ctx.plan
        if ctx.key is not None:  # stored before launch (reconcile); every node's part names its file
            from sparkctl.paths import api_key_file

            plan = dataclasses.replace(plan, api_key_file=str(api_key_file(plan.recipe_name)))
        cluster = _cluster(ctx.recipe, plan, ctx.opts, ctx.rep, ctx.timings)
        ctx.plan = dataclasses.replace(plan, runtime="cluster", cluster=cluster)
    for w in ctx.plan.warnings:
        if not (ctx.across and w.startswith("cluster.")):  # per-node values replace these
            ctx.rep.warn(w)


def _stage_dry_run(ctx: UpContext) -> None:
    if ctx.opts.dry_run:
        ctx.finish(dry_run=True, unit=ctx.unit)


def _stage_reconcile(ctx: UpContext) -> None:
    """Already up? (--restart: stop it first.) Port free? Then the new key goes into its 0600 file."""
    if ctx.opts.restart:
        _stop_previous(ctx.plan, ctx.rep)
    existing = _existing(ctx.plan, ctx.runtime, ctx.rep, port_asked=ctx.opts.overrides.port_asked)
    if existing is not None:
        ctx.finish(state=existing, already_running=True)
        return
    _check_port(ctx.plan)
    if ctx.key is not None:
        from sparkctl.planner.keyed import with_key_file
        from sparkctl.server import auth

        path = auth.store(ctx.plan.recipe_name, ctx.plan.engine, ctx.key)
        ctx.key_stored = True
        ctx.plan = with_key_file(ctx.plan, str(path))


def _stage_doctor(ctx: UpContext) -> None:
    t = time.monotonic()
    detail = _doctor(ctx.plan, ctx.rep)
    ctx.runtime.check()
    ctx.timings["doctor"] = time.monotonic() - t
    ctx.rep.step("doctor", detail, ctx.timings["doctor"])


def _stage_ready(ctx: UpContext) -> None:
    """What the plan runs is here (the image, the installed engine) before a download of many GB."""
    if ctx.opts.build and ctx.plan.container is not None:
        t = time.monotonic()
        _build_image(ctx.recipe, ctx.rep)
        ctx.timings["build"] = time.monotonic() - t
    t = time.monotonic()
    ctx.plan = ctx.runtime.ensure_ready(ctx.plan)
    ctx.timings["ready"] = time.monotonic() - t
    if ctx.plan.container is not None and ctx.plan.cluster is None:
        ctx.rep.step("image", f"{ctx.plan.container.image} (present)", ctx.timings["ready"])


def _stage_fetch(ctx: UpContext) -> None:
    from sparkctl.models.fetch import resolve_weights

    t = time.monotonic()
    ctx.model_path, ctx.files = resolve_weights(ctx.plan.model, offline=ctx.opts.offline)
    _check_shards(ctx.plan, ctx.files)
    size = sum(f.stat().st_size for f in ctx.files)
    ctx.timings["fetch"] = time.monotonic() - t
    ctx.rep.step(
        "fetch", f"{ctx.model_path} ({len(ctx.files)} weight file(s), {_gib(size)})", ctx.timings["fetch"]
    )


def _stage_prepare(ctx: UpContext) -> None:
    """The pack's overlay (the download stays as is), then the plan again if the model was not here when
    `up` planned: the memory plan reads its config.json and a docker plan mounts its directory."""
    assert ctx.model_path is not None
    if ctx.plan.model.prepare is not None:
        from sparkctl.prepare import prepare_model

        t = time.monotonic()
        _, prepared = prepare_model(ctx.plan.model, ctx.model_path)
        assert prepared is not None
        ctx.model_path = prepared.overlay
        ctx.timings["prepare"] = time.monotonic() - t
        ctx.rep.step("prepare", prepared.summary(), ctx.timings["prepare"])
    if ctx.planned_with is None or ctx.planned_with.resolve() != ctx.model_path.resolve():
        key_file = ctx.plan.api_key_file
        ctx.plan = dataclasses.replace(_plan(ctx.recipe, ctx.model_path, ctx.opts), api_key_file=key_file)
        ctx.plan = ctx.runtime.ensure_ready(ctx.plan)
    if ctx.plan.memory is not None:
        m = ctx.plan.memory
        verdict = "fits" if m.fits else "DOES NOT FIT (--force)"
        ctx.rep.step(
            "memory",
            f"weights {_gib(m.weights_bytes)} + kv {_gib(m.kv_cache_bytes)} + overhead "
            f"{_gib(m.runtime_overhead_bytes)} of {_gib(m.budget_bytes)} budget: {verdict}",
        )


def _stage_prewarm(ctx: UpContext) -> None:
    t = time.monotonic()
    ctx.steward = _prewarm(ctx.plan, ctx.files, ctx.rep)
    ctx.timings["prewarm"] = time.monotonic() - t


def _stage_launch(ctx: UpContext) -> None:
    ctx.log_path = _fresh_log(ctx.plan.recipe_name)
    t = time.monotonic()
    with _interrupts_held():  # Ctrl-C between the spawn and `server =` would leave it running
        ctx.server = ctx.runtime.start(ctx.plan, ctx.log_path, lambda line: ctx.rep.step("node", line))
    state_files.save(ctx.server)
    ctx.timings["launch"] = time.monotonic() - t
    ctx.rep.step("launch", _where(ctx.server), ctx.timings["launch"])


def _stage_health(ctx: UpContext) -> None:
    from sparkctl.server.auth import key_of

    plan, runtime, server = ctx.plan, ctx.runtime, ctx.server
    assert server is not None
    t = time.monotonic()
    with ctx.rep.waiting(plan.recipe_name) as on_tick:
        wait_healthy(
            plan.base_url,
            plan.served_model_name,
            label=plan.recipe_name,
            timeout_s=plan.health_timeout_s,
            exit_detail=lambda: runtime.exit_detail(server),
            last_lines=lambda n: _last_lines(runtime, server, n),
            on_tick=on_tick,
            api_key=key_of(plan.api_key_file),
        )
    ctx.timings["health"] = time.monotonic() - t
    seconds_to_healthy = time.monotonic() - ctx.t_start
    ctx.rep.step("health", f"{plan.base_url} serves {plan.served_model_name}", ctx.timings["health"])
    if ctx.steward is not None:
        ctx.steward = _stop_steward(ctx.steward, ctx.rep)
    ctx.finish(done=False, state=server, model_path=ctx.model_path, seconds_to_healthy=seconds_to_healthy)


def _stage_smoke(ctx: UpContext) -> None:
    from sparkctl.server.auth import key_of

    plan, result = ctx.plan, ctx.result
    assert result is not None
    t = time.monotonic()
    reply = smoke_test(plan.base_url, plan.served_model_name, api_key=key_of(plan.api_key_file))
    ctx.timings["smoke"] = time.monotonic() - t
    result.smoke_reply, result.smoke_tokens = reply.content, reply.completion_tokens
    ctx.rep.step("smoke", f"1 chat completion, {reply.completion_tokens} token(s)", ctx.timings["smoke"])


def _stage_persist(ctx: UpContext) -> None:
    """Once healthy: the memory watchdog, and what brings it back after a reboot (last: a failure before
    it leaves nothing behind)."""
    plan, server, result = ctx.plan, ctx.server, ctx.result
    assert server is not None and result is not None and ctx.log_path is not None
    if plan.watchdog is not None and WATCHDOG in ctx.runtime.capabilities:
        from sparkctl import watchdog

        floor, interval = plan.watchdog
        with _interrupts_held():
            server.extra["watchdog_pid"] = str(watchdog.start(server, floor, interval))
        state_files.save(server)
        ctx.rep.step("watchdog", f"stops the server if MemAvailable falls below {_gib(floor)}")
    if ctx.opts.persist:
        result.unit = ctx.runtime.persistence(plan, ctx.log_path, install=True)
        if result.unit is not None:
            ctx.rep.step("persist", f"{result.unit[0]} (enabled: starts at login or, with linger, boot)")


STAGES: tuple[Stage, ...] = (
    Stage("validate", _stage_validate),
    Stage("plan", _stage_plan),
    Stage("dry-run", _stage_dry_run),
    Stage("reconcile", _stage_reconcile, locked=True),
    Stage("doctor", _stage_doctor, needs=LOCAL_MODEL, locked=True),
    Stage("ready", _stage_ready, locked=True),
    Stage("fetch", _stage_fetch, needs=LOCAL_MODEL, locked=True),
    Stage("prepare", _stage_prepare, needs=LOCAL_MODEL, locked=True),
    Stage("prewarm", _stage_prewarm, needs=LOCAL_MODEL, locked=True),
    Stage("launch", _stage_launch, locked=True),
    Stage("health", _stage_health, locked=True),
    Stage("smoke", _stage_smoke, locked=True),
    Stage("persist", _stage_persist, locked=True),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
# `sparkctl prewarm RECIPE`: the recipe's model as `up` would find it, nothing served
PREWARM_STAGES: tuple[str, ...] = ("validate",)


def stages_for(opts: UpOptions) -> tuple[str, ...]:
    """The subset of STAGES a request runs: `--no-smoke` (and `bench --up`) skip the smoke test;
    `--restart` is the whole list, its reconcile stopping the running server first."""
    return tuple(n for n in STAGE_NAMES if n != "smoke" or opts.smoke)


def run_up(opts: UpOptions, reporter: Reporter | None = None) -> UpResult:
    """`up`: run the request's stages in order; the result of the one that ended it."""
    ctx = run_stages(opts, stages_for(opts), reporter)
    assert ctx.result is not None
    ctx.result.stages = list(ctx.ran)
    if ctx.key is not None and opts.api_key == "generate" and ctx.key_stored and ctx.result.state is not None:
        ctx.result.api_key_generated = ctx.key
    return ctx.result


def run_stages(opts: UpOptions, names: tuple[str, ...], reporter: Reporter | None = None) -> UpContext:
    """Run the named stages of STAGES in their order over one context. From `reconcile` on they hold the
    recipe's start lock; once something is launched, any failure (a health timeout, an early exit,
    Ctrl-C, SIGTERM) stops what was started and removes its state again, so a failed `up` leaves nothing."""
    unknown = sorted(set(names) - set(STAGE_NAMES))
    if unknown:
        raise UserError(f"unknown stage(s) {', '.join(unknown)}", hint=f"valid: {', '.join(STAGE_NAMES)}")
    ctx = UpContext(opts=opts, rep=reporter or Reporter())
    with contextlib.ExitStack() as stack:
        locked = False
        try:
            for stage in STAGES:
                if stage.name not in names:
                    continue
                if stage.needs is not None and stage.needs not in ctx.runtime.capabilities:
                    continue
                if stage.locked and not locked:
                    stack.enter_context(state_files.starting(ctx.plan.recipe_name))
                    locked = True
                ctx.rep.stage(stage.name)
                ctx.ran.append(stage.name)
                stage.run(ctx)
                if ctx.done:
                    break
        except BaseException:
            _undo(ctx)
            raise
    return ctx


def locate_model(recipe: str, sets: tuple[str, ...] = ()) -> tuple[Path, int]:
    """`sparkctl prewarm RECIPE`: the directory already holding the recipe's model (the PREWARM_STAGES of
    `up`, nothing served) and its `load.workers`; never downloads."""
    from sparkctl.models.fetch import local_model_path

    opts = UpOptions(recipe=recipe, overrides=Overrides(sets=sets), serve=False)
    plan = run_stages(opts, PREWARM_STAGES).plan
    local = local_model_path(plan.model)
    if local is None:
        m = plan.model
        raise UserError(
            f"recipe {recipe}: its model ({m.repo or m.path or m.generate}) is not on this machine yet",
            hint=f"`sparkctl up {recipe}` fetches it; or pass a model directory",
        )
    return local, plan.load.workers


def _undo(ctx: UpContext) -> None:
    """A failed or interrupted `up`: stop what it started, and a key nobody has seen goes with it."""
    if not _clean_up_after(ctx.runtime, ctx.server, ctx.steward):
        assert ctx.server is not None
        ctx.rep.warn(
            f"could not stop {_where(ctx.server)} (its runtime does not answer): its state is kept, "
            f"`sparkctl down {ctx.plan.recipe_name}` stops it once it does"
        )
    if ctx.key_stored and ctx.opts.api_key == "generate":
        Path(ctx.plan.api_key_file or "").unlink(missing_ok=True)


# -- stages ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a process is spawned and recorded, then act on one that came.

    An interrupt inside `runtime.start` after its fork would leave a server that no clean-up knows of
    (found by tests/safety/test_ctrl_c_stages.py). Python-level handlers, not a signal mask: a mask would
    be inherited by the engine, which then could not be stopped with SIGTERM.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # signals are delivered to the main thread only
        return
    came: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: came.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if came:
            signal.raise_signal(came[0])  # to the handler that was in place: KeyboardInterrupt for `up`


def _build_image(recipe: Any, rep: Reporter) -> None:
    from sparkctl.image.build import build
    from sparkctl.image.spark import spark_spec
    from sparkctl.runtimes.docker import connect

    spec, _ = spark_spec(recipe)
    t = time.monotonic()
    with rep.building(spec.alias or spec.repository) as on_event:
        result = build(spec, connect(timeout_s=30), on_event=on_event)
    what = "built" if result.built else "up to date, not rebuilt"
    rep.step("build", f"{result.tag} ({what})", time.monotonic() - t)


def _api_key(recipe: Any, plan: Plan, opts: UpOptions) -> str | None:
    """The API key this `up` sets (to store before launch), None to keep the recipe's stored one or none.

    A server bound to anything but loopback with no key at all is refused unless --no-auth: on a home
    network that is a free GPU for anyone, and a token-holding machine's shell for some engines' tools.
    """
    from sparkctl.server import auth

    key: str | None = None
    if opts.api_key == auth.GENERATE:
        key = auth.generate()
    elif opts.api_key:
        key = auth.check_key(opts.api_key, "--api-key")
    elif recipe.serve.api_key_file:
        key = auth.read_key_file(recipe.serve.api_key_file)
    has_key = key is not None or auth.key_of(plan.api_key_file) is not None
    if not has_key and not auth.is_loopback(plan.host) and not (opts.no_auth or recipe.serve.no_auth):
        raise UserError(
            f"{plan.recipe_name} would listen on {plan.host}:{plan.port} with no API key: anyone who can "
            "reach this machine could use it",
            hint="--api-key generate (a new key, stored 0600 and printed once), --api-key KEY, "
            "serve.api_key_file, or --no-auth to serve it open anyway",
        )
    return key


def _warn_if_open(plan: Plan, key: str | None, rep: Reporter) -> None:
    """`--no-auth` on a non-loopback address is allowed, never quiet: said first, in capitals."""
    from sparkctl.server import auth

    if key is None and auth.key_of(plan.api_key_file) is None and not auth.is_loopback(plan.host):
        rep.warn(
            f"OPEN TO THE NETWORK: {plan.recipe_name} will listen on {plan.host}:{plan.port} with NO API key "
            "(--no-auth): anyone who can reach this machine can use it and read what it generates"
        )


def _cluster(recipe: Any, plan: Plan, opts: UpOptions, rep: Reporter, timings: dict[str, float]) -> Any:
    """Preflight every node and compute its own environment; a dry run reports failed checks as warnings
    (it still prints what would run), a real start stops at the first one."""
    from sparkctl.cluster.plan import cluster_nodes, plan_cluster

    t = time.monotonic()
    nodes = cluster_nodes(recipe, opts.nodes)
    cluster = plan_cluster(recipe, plan, nodes, strict=not opts.dry_run)
    timings["cluster"] = time.monotonic() - t
    rep.step(
        "cluster",
        ", ".join(f"{n.node} {n.interface} {n.address}" for n in cluster.report.networks.values()),
        timings["cluster"],
    )
    for f in cluster.report.findings:
        if f.status != "ok":
            rep.warn(f"{f.node}: {f.check}: {f.detail}" + (f" (fix: {f.fix})" if f.fix else ""))
    return cluster


def _load(opts: UpOptions) -> Any:
    from sparkctl.recipe.overrides import load

    ov = opts.overrides
    if ov.port == 0:  # any free port; `port_asked` still reads the 0 the user gave
        from sparkctl.server.ports import free_port

        ov = dataclasses.replace(ov, port=free_port())
    return load(opts.recipe, ov)


def _already_local(recipe: Any) -> Path | None:
    """Where the model already is (no network, no write): planning with it lets `up` plan once."""
    from sparkctl.models.fetch import local_model_path
    from sparkctl.planner.build import model_source

    source = model_source(recipe)
    if source.prepare is not None:
        return None  # served from its prepare overlay, which the plan names by itself
    return local_model_path(source)


def _plan(recipe: Any, model_path: Path | None, opts: UpOptions) -> Plan:
    from sparkctl.planner.build import make_plan
    from sparkctl.planner.facts import gather_facts

    # what this machine has (model files, binaries, memory, key file, link targets), then the pure planner
    facts = gather_facts(recipe, str(model_path) if model_path else None)
    made = make_plan(recipe, facts, check_memory=not opts.force)
    if opts.persist and made.container is not None:  # native: a systemd user unit once healthy (_launch)
        made = dataclasses.replace(
            made, container=dataclasses.replace(made.container, restart_policy="unless-stopped")
        )
    return made


def _existing(plan: Plan, runtime: Runtime, rep: Reporter, *, port_asked: bool = False) -> ServerState | None:
    """The same recipe already up and healthy -> its state; running but sick -> error; stale -> cleaned.

    Up on another port than the one asked for is an error (nothing answers where the user will look);
    on another port than the recipe's default it is only a note.
    """
    from sparkctl.server.client import probe_health

    old = state_files.load(plan.recipe_name)
    if old is None:
        return None
    old_runtime = runtime if old.runtime == runtime.name else get_runtime(old.runtime)
    if old_runtime.is_running(old):
        if probe_health(old.base_url):
            if old.port != plan.port and port_asked:
                raise UserError(
                    f"{plan.recipe_name} is already running on port {old.port}, not {plan.port}",
                    hint=f"use {old.base_url}/v1, or move it: sparkctl down {plan.recipe_name}, then up again",
                )
            if old.port != plan.port:
                rep.warn(
                    f"{plan.recipe_name} is already running on port {old.port}, not {plan.port}; "
                    f"`sparkctl up --restart` to move it"
                )
            elif old.recipe_hash != plan.recipe_hash:
                rep.warn(
                    f"{plan.recipe_name} is running with an older version of its recipe; "
                    f"`sparkctl up --restart` to apply the change"
                )
            return old
        raise RuntimeFailure(
            f"{plan.recipe_name} is already running ({_where(old)}) but {old.base_url}/health does not answer",
            hint=f"it may still be loading: sparkctl logs -f {plan.recipe_name}; or stop it: sparkctl down {plan.recipe_name}",
        )
    old_runtime.stop(old)  # leftovers of a server that died on its own
    state_files.remove(plan.recipe_name)
    rep.warn(f"{plan.recipe_name} had a state file but was not running (cleaned up)")
    return None


def _stop_previous(plan: Plan, rep: Reporter) -> None:
    """`up --restart`: stop whatever runs for this recipe (healthy, sick or dead) before starting it again."""
    old = state_files.load(plan.recipe_name)
    if old is None:
        return
    t = time.monotonic()
    get_runtime(old.runtime).stop(old)
    state_files.remove(plan.recipe_name)
    rep.step("restart", f"stopped the running {plan.recipe_name} ({_where(old)})", time.monotonic() - t)


def _check_port(plan: Plan) -> None:
    """Another recipe of ours on the port is named as such; anything else through the one port check."""
    from sparkctl.server.ports import ensure_free

    for other in state_files.load_all():
        if other.recipe == plan.recipe_name or other.port != plan.port:
            continue
        try:
            running = get_runtime(other.runtime).is_running(other)
        except Exception:  # e.g. its Docker daemon is down: then it does not hold the port either
            running = False
        if running:
            raise UserError(
                f"port {plan.port} is taken by recipe {other.recipe} ({_where(other)})",
                hint=f"stop it (sparkctl down {other.recipe}) or pick another port: --port N",
            )
    ensure_free(plan.host, plan.port)


def _doctor(plan: Plan, rep: Reporter) -> str:
    """Run the doctor checks this launch needs; a `fail` stops `up` with that check's hint."""
    from sparkctl.doctor import run_checks

    only = doctor_checks_for(plan)
    checks = run_checks(plan, only=only)
    for c in checks:
        if c.status == "fail":
            raise RuntimeFailure(f"doctor: {c.name}: {c.detail}", hint=c.hint)
        if c.status == "warn":
            rep.warn(f"doctor: {c.name}: {c.detail}" + (f" ({c.hint})" if c.hint else ""))
    return ", ".join(f"{c.name} {c.status}" for c in checks) or "no checks needed"


def _prewarm(plan: Plan, files: list[Path], rep: Reporter) -> Any:
    """Warm per `plan.load`; return a started EvictionSteward when the load should be watched."""
    if plan.load.prewarm == "never" and not plan.load.evict_after_load:
        rep.step("prewarm", "skipped (load.prewarm: never)")
        return None
    import prewarm

    need = sum(f.stat().st_size for f in files) - sum(prewarm.resident_bytes(f) for f in files)
    decision = prewarm.decide(
        plan.load.prewarm,
        fit=prewarm.fit_check(max(0, need)),
        unified=prewarm.is_unified_memory(),
        evict_after_load=plan.load.evict_after_load,
    )
    if decision.warm:
        report = prewarm.warm(files, workers=plan.load.workers)
        if report.interrupted:  # prewarm stops its readers and reports a Ctrl-C; for `up` it ends the start
            raise KeyboardInterrupt
        rep.step(
            "prewarm",
            f"{_gib(report.bytes_read)} in {report.seconds:.1f}s ({report.gib_per_s:.2f} GiB/s, "
            f"{plan.load.workers} workers), {100 * report.residency_after:.0f}% cached",
        )
        for w in report.warnings:
            rep.warn(f"prewarm: {w}")
    else:
        rep.step("prewarm", f"skipped: {decision.reason}")
    if decision.evict_during_load:
        return prewarm.EvictionSteward(files).start()
    return None


def _check_shards(plan: Plan, files: list[Path]) -> None:
    """A truncated or unreadable shard is said in a second, before the launch, not after a load of minutes
    that ends in the engine's `SafetensorError` (stat and the safetensors header only: no data is read)."""
    from prewarm import PrewarmError, inspect_files

    try:
        inspect_files(files)
    except PrewarmError as exc:
        raise RuntimeFailure(f"{plan.recipe_name}: {exc}", hint=exc.hint) from None


def _stop_steward(steward: Any, rep: Reporter) -> None:
    report = steward.stop()
    if report is not None:
        rep.step(
            "evict",
            f"shards dropped from the page cache after load ({100 * report.residency_after:.0f}% still cached, "
            f"{steward.passes} passes while loading)",
        )
    return None


def _fresh_log(recipe: str) -> Path:
    """This launch's log file; the previous launch's is kept as `.1` for comparison."""
    path = state_files.log_path(recipe)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            os.replace(path, path.with_name(path.name + ".1"))
    except OSError as exc:
        raise write_failure(path, exc) from None
    return path


def _last_lines(runtime: Runtime, server: ServerState, n: int) -> list[str]:
    try:
        return list(runtime.logs(server, tail=n))
    except Exception:  # a log read must never mask the real failure being reported
        return []


class _Hurry(BaseException):
    """A second Ctrl-C (or SIGTERM) during the clean-up of a failed `up`: finish it now, with SIGKILL."""


@contextlib.contextmanager
def _on_interrupt(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """SIGINT and SIGTERM go to `handler` for the duration (main thread only: signals land there)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, handler) for s in held}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _clean_up_after(runtime: Runtime, server: ServerState | None, steward: Any) -> bool:
    """The clean-up of a failed or interrupted `up`; False when the server could not be stopped.

    The user who presses Ctrl-C again while it waits for the server to exit wants it done sooner, not
    skipped: the second one cuts the grace period short (SIGKILL), and any further one is ignored until
    the server is gone and forgotten.
    """

    def hurry(signum: int, frame: Any) -> None:
        raise _Hurry

    try:
        with _on_interrupt(hurry):
            if steward is not None:
                with contextlib.suppress(Exception):
                    steward.stop(verify=False)
            return server is None or _cleanup(runtime, server)
    except _Hurry:
        pass
    with _on_interrupt(lambda signum, frame: None):
        return server is None or _cleanup(runtime, server, timeout_s=0.0)


def _cleanup(runtime: Runtime, server: ServerState, timeout_s: float = 15.0) -> bool:
    """Stop and forget a server whose `up` failed; errors here must not hide the original one. One that
    could not be stopped (its Docker daemon gone) keeps its state file, so `down` can finish the job."""
    try:
        runtime.stop(server, timeout_s=timeout_s)
    except Exception:
        return False
    state_files.remove(server.recipe)
    return True


def _where(s: ServerState) -> str:
    if s.nodes:
        return f"{len(s.parts)} part(s) on {', '.join(n['address'] for n in s.nodes)}"
    if s.container_name or s.container_id:
        return f"container {s.container_name or s.container_id[:12]}"
    return f"pid {s.pid}" if s.pid else s.runtime


def _gib(n: int) -> str:
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"
