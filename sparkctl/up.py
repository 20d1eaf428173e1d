"""`sparkctl up`: from a recipe name to a healthy, smoke-tested OpenAI endpoint, one visible stage at a time.

validate -> plan -> (dry run stops here) -> already up? -> port free? -> doctor -> image -> fetch ->
prepare -> memory plan -> prewarm -> launch -> health -> smoke -> summary.

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
from sparkctl.runtimes.base import Runtime, ServerState
from sparkctl.runtimes.registry import get_runtime
from sparkctl.server.health import Tick, smoke_test, wait_healthy


class Reporter:
    """Progress sink for the pipeline; the default does nothing (library use, tests)."""

    def step(self, name: str, detail: str, seconds: float | None = None) -> None:
        """A stage finished."""

    def warn(self, message: str) -> None:
        """Something the user should know that does not stop `up`."""

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
        }


def doctor_checks_for(plan: Plan) -> list[str]:
    """Only the checks this launch depends on: a CPU-only native server needs no GPU or Docker."""
    from sparkctl.doctor import needs_of

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
    if needs.engine in ("llama.cpp", "freetoken") and plan.runtime == "native":
        names.append(needs.engine)  # the binary/venv sparkctl installs, its build, CUDA where needed
    return names


def run_up(opts: UpOptions, reporter: Reporter | None = None) -> UpResult:
    rep = reporter or Reporter()
    t_start = time.monotonic()
    timings: dict[str, float] = {}

    # validate + plan ------------------------------------------------------------------------------
    t = time.monotonic()
    recipe = _load(opts)
    local = _already_local(recipe)
    plan = _plan(recipe, local, opts)
    key = _api_key(recipe, plan, opts)
    across = opts.nodes is not None or (recipe.cluster.nodes > 1 and bool(recipe.cluster.hosts))
    unit = None
    if opts.persist and plan.runtime == "native" and not across:
        from sparkctl.runtimes import systemd

        # rendered now, so a value a unit cannot hold is refused before anything starts
        text = systemd.render_unit(plan, state_files.log_path(plan.recipe_name), strict=not opts.dry_run)
        unit = (str(systemd.unit_path(plan.recipe_name)), text)
    timings["validate"] = time.monotonic() - t
    rep.step(
        "validate",
        f"recipe {plan.recipe_name} ({plan.runtime}, {plan.engine}) -> {plan.base_url}",
        timings["validate"],
    )
    cluster = None
    if across:
        if key is not None:  # stored before launch (below); every node's part is planned with its file
            from sparkctl.paths import api_key_file

            plan = dataclasses.replace(plan, api_key_file=str(api_key_file(plan.recipe_name)))
        cluster = _cluster(recipe, plan, opts, rep, timings)
        plan = dataclasses.replace(plan, runtime="cluster", cluster=cluster)
    for w in plan.warnings:
        if cluster is None or not w.startswith("cluster."):  # per-node values replace these
            rep.warn(w)
    if opts.dry_run:
        return UpResult(plan=plan, dry_run=True, timings=timings, cluster=cluster, unit=unit)
    if cluster is not None:
        with state_files.starting(plan.recipe_name):
            return _start_cluster(opts, plan, cluster, rep, t_start, timings, key)
    with state_files.starting(plan.recipe_name):
        return _start(opts, recipe, plan, local, rep, t_start, timings, key)


def _start(
    opts: UpOptions,
    recipe: Any,
    plan: Plan,
    planned_with: Path | None,
    rep: Reporter,
    t_start: float,
    timings: dict[str, float],
    key: str | None = None,
) -> UpResult:
    """Everything after validation, run while holding the recipe's start lock. `planned_with` is the model
    directory the plan was made with (None: not on this machine yet); `key` a new API key to store."""
    runtime = get_runtime(plan.runtime)

    # already up? port free? -------------------------------------------------------------------------
    if opts.restart:
        _stop_previous(plan, rep)
    existing = _existing(plan, runtime, rep, port_asked=opts.overrides.port_asked)
    if existing is not None:
        return UpResult(plan=plan, state=existing, already_running=True, timings=timings)
    _check_port(plan)
    if key is not None:
        from sparkctl.server import auth

        plan = dataclasses.replace(plan, api_key_file=str(auth.store(plan.recipe_name, plan.engine, key)))
    try:
        result = _launch(opts, recipe, plan, planned_with, rep, t_start, timings, runtime)
    except BaseException:
        if key is not None and opts.api_key == "generate":  # a key nobody has seen goes with the failed up
            Path(plan.api_key_file or "").unlink(missing_ok=True)
        raise
    if key is not None and opts.api_key == "generate":
        result.api_key_generated = key
    return result


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


def _launch(
    opts: UpOptions,
    recipe: Any,
    plan: Plan,
    planned_with: Path | None,
    rep: Reporter,
    t_start: float,
    timings: dict[str, float],
    runtime: Runtime,
) -> UpResult:
    """doctor -> image -> fetch -> memory -> prewarm -> launch -> health -> smoke."""
    from sparkctl.server.auth import key_of

    # doctor -------------------------------------------------------------------------------------------
    t = time.monotonic()
    detail = _doctor(plan, rep)
    runtime.check()
    if plan.runtime == "native":  # not installed: said before a download of many GB, not after
        from sparkctl.runtimes.native import require_executable

        require_executable(plan)
    timings["doctor"] = time.monotonic() - t
    rep.step("doctor", detail, timings["doctor"])

    # image (before any download: a missing image should cost seconds, not a 90 GB fetch) -----------
    if plan.runtime == "docker" and opts.build:
        t = time.monotonic()
        _build_image(recipe, rep)
        timings["build"] = time.monotonic() - t
    if plan.runtime == "docker":
        t = time.monotonic()
        from sparkctl.runtimes.docker import ensure_plan_image

        image_id = ensure_plan_image(plan)
        timings["image"] = time.monotonic() - t
        image = plan.container.image if plan.container else "?"
        rep.step("image", f"{image} ({image_id[:19]})", timings["image"])

    # fetch + memory plan ------------------------------------------------------------------------------
    from sparkctl.models.fetch import resolve_weights

    t = time.monotonic()
    model_path, files = resolve_weights(plan.model, offline=opts.offline)
    _check_shards(plan, files)
    size = sum(f.stat().st_size for f in files)
    timings["fetch"] = time.monotonic() - t
    rep.step("fetch", f"{model_path} ({len(files)} weight file(s), {_gib(size)})", timings["fetch"])
    if plan.model.prepare is not None:  # serve an overlay with the pack's fix-ups; the download stays as is
        from sparkctl.prepare import prepare_model

        t = time.monotonic()
        _, prepared = prepare_model(plan.model, model_path)
        assert prepared is not None
        model_path = prepared.overlay
        timings["prepare"] = time.monotonic() - t
        rep.step("prepare", prepared.summary(), timings["prepare"])

    if planned_with is None or planned_with.resolve() != model_path.resolve():
        # the model was not here when `up` planned (a first download or generation): plan again with it,
        # as the memory plan reads its config.json and a docker plan mounts its directory
        plan = _plan(recipe, model_path, opts)
    if plan.memory is not None:
        m = plan.memory
        verdict = "fits" if m.fits else "DOES NOT FIT (--force)"
        rep.step(
            "memory",
            f"weights {_gib(m.weights_bytes)} + kv {_gib(m.kv_cache_bytes)} + overhead "
            f"{_gib(m.runtime_overhead_bytes)} of {_gib(m.budget_bytes)} budget: {verdict}",
        )

    # prewarm ------------------------------------------------------------------------------------------
    log_path = _fresh_log(plan.recipe_name)
    t = time.monotonic()
    steward = _prewarm(plan, files, rep)
    timings["prewarm"] = time.monotonic() - t

    # launch -> health -> smoke: from here on, any failure stops what was started --------------------
    t_launch = time.monotonic()
    server: ServerState | None = None
    try:
        with _interrupts_held():  # Ctrl-C between the spawn and `server =` would leave it running
            server = runtime.start(plan, log_path)
        state_files.save(server)
        timings["launch"] = time.monotonic() - t_launch
        rep.step("launch", _where(server), timings["launch"])

        t = time.monotonic()
        with rep.waiting(plan.recipe_name) as on_tick:
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
        timings["health"] = time.monotonic() - t
        seconds_to_healthy = time.monotonic() - t_start
        rep.step("health", f"{plan.base_url} serves {plan.served_model_name}", timings["health"])

        if steward is not None:
            steward = _stop_steward(steward, rep)

        result = UpResult(
            plan=plan,
            state=server,
            model_path=model_path,
            timings=timings,
            seconds_to_healthy=seconds_to_healthy,
        )
        if opts.smoke:
            t = time.monotonic()
            reply = smoke_test(plan.base_url, plan.served_model_name, api_key=key_of(plan.api_key_file))
            timings["smoke"] = time.monotonic() - t
            result.smoke_reply, result.smoke_tokens = reply.content, reply.completion_tokens
            rep.step("smoke", f"1 chat completion, {reply.completion_tokens} token(s)", timings["smoke"])
        if plan.watchdog is not None:
            from sparkctl import watchdog

            floor, interval = plan.watchdog
            with _interrupts_held():
                server.extra["watchdog_pid"] = str(watchdog.start(server, floor, interval))
            state_files.save(server)
            rep.step("watchdog", f"stops the server if MemAvailable falls below {_gib(floor)}")
        if opts.persist and plan.runtime == "native":  # last: a failure before it leaves no unit behind
            from sparkctl.runtimes import systemd

            unit = systemd.install(plan, log_path)
            result.unit = (str(unit), unit.read_text())
            rep.step("persist", f"systemd user unit {unit} (enabled: starts at login or, with linger, boot)")
        return result
    except BaseException:
        if steward is not None:
            with contextlib.suppress(Exception):
                steward.stop(verify=False)
        if server is not None and not _cleanup(runtime, server):
            rep.warn(
                f"could not stop {_where(server)} (its runtime does not answer): its state is kept, "
                f"`sparkctl down {plan.recipe_name}` stops it once it does"
            )
        raise


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


def _start_cluster(
    opts: UpOptions,
    plan: Plan,
    cluster: Any,
    rep: Reporter,
    t_start: float,
    timings: dict[str, float],
    key: str | None = None,
) -> UpResult:
    """Start every node's part (preflight passed), wait for the endpoint on the head, smoke-test it; a
    failure stops every node's part again. The model must already be on every node (the preflight says)."""
    from sparkctl.server.auth import key_of

    runtime = get_runtime(plan.runtime)
    if opts.restart:
        _stop_previous(plan, rep)
    existing = _existing(plan, runtime, rep, port_asked=opts.overrides.port_asked)
    if existing is not None:
        return UpResult(plan=plan, state=existing, already_running=True, timings=timings, cluster=cluster)
    if key is not None:
        from sparkctl.server import auth

        auth.store(plan.recipe_name, plan.engine, key)
    t = time.monotonic()
    server: ServerState | None = None
    try:
        with _interrupts_held():
            server = runtime.start(
                plan, state_files.log_path(plan.recipe_name), lambda line: rep.step("node", line)
            )
        state_files.save(server)
        timings["launch"] = time.monotonic() - t
        t = time.monotonic()
        with rep.waiting(plan.recipe_name) as on_tick:
            wait_healthy(
                plan.base_url,
                plan.served_model_name,
                label=plan.recipe_name,
                timeout_s=plan.health_timeout_s,
                exit_detail=lambda: runtime.exit_detail(server),
                last_lines=lambda n: _last_lines(runtime, server, n)[-n:],
                on_tick=on_tick,
                api_key=key_of(plan.api_key_file),
            )
        timings["health"] = time.monotonic() - t
        rep.step("health", f"{plan.base_url} serves {plan.served_model_name}", timings["health"])
        result = UpResult(plan=plan, state=server, timings=timings, cluster=cluster)
        result.seconds_to_healthy = time.monotonic() - t_start
        if opts.smoke:
            t = time.monotonic()
            reply = smoke_test(plan.base_url, plan.served_model_name, api_key=key_of(plan.api_key_file))
            timings["smoke"] = time.monotonic() - t
            result.smoke_reply, result.smoke_tokens = reply.content, reply.completion_tokens
            rep.step("smoke", f"1 chat completion, {reply.completion_tokens} token(s)", timings["smoke"])
        if key is not None and opts.api_key == "generate":
            result.api_key_generated = key
        return result
    except BaseException:
        if server is not None:
            _cleanup(runtime, server)
        if key is not None and opts.api_key == "generate":
            Path(plan.api_key_file or "").unlink(missing_ok=True)
        raise


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
    from sparkctl.planner import plan

    made = plan(recipe, model_path=str(model_path) if model_path else None, check_memory=not opts.force)
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


def _cleanup(runtime: Runtime, server: ServerState) -> bool:
    """Stop and forget a server whose `up` failed; errors here must not hide the original one. One that
    could not be stopped (its Docker daemon gone) keeps its state file, so `down` can finish the job."""
    try:
        runtime.stop(server, timeout_s=15.0)
    except Exception:
        return False
    state_files.remove(server.recipe)
    return True


def _where(s: ServerState) -> str:
    if s.container_name or s.container_id:
        return f"container {s.container_name or s.container_id[:12]}"
    return f"pid {s.pid}" if s.pid else s.runtime


def _gib(n: int) -> str:
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"
