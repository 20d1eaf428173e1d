"""The servers sparkctl started, as records: find one by recipe, say whether it can answer, list them with
live health, stop them, read their logs. `down`, `status`, `logs` and `chat` only parse and render these.

A recipe is named as in `up`: a built-in name, or a YAML path whose recipe name (inside the file) is what
the state file is keyed by.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sparkctl.errors import RuntimeFailure, UserError
from sparkctl.runtimes import state as state_files
from sparkctl.runtimes.base import ServerState
from sparkctl.runtimes.registry import get_runtime


def recipe_name(recipe: str) -> str:
    """The recipe name behind a YAML path (`up my.yaml` runs the recipe named inside it); a name as is."""
    if not (recipe.endswith((".yaml", ".yml")) or "/" in recipe):
        return recipe
    try:
        from sparkctl.recipe import load_recipe

        return str(load_recipe(recipe).name)
    except UserError:
        return recipe


def find_state(recipe: str) -> ServerState | None:
    """The recorded server of RECIPE (a name or a YAML path), or None."""
    found = state_files.load(recipe)
    if found is not None:
        return found
    name = recipe_name(recipe)
    return state_files.load(name) if name != recipe else None


def known_recipe(recipe: str) -> None:
    """Raise the loader's UserError (exit 2, with "did you mean") when RECIPE has never run here and is neither a
    built-in name nor an existing YAML file: `down`/`status` of a misspelt name answered "not running" and exit
    0, which a user (or a script) takes for "stopped". A name with a kept log ran here (`up my.yaml` runs the
    recipe named inside it), so stopping it again stays fine."""
    if state_files.log_path(recipe_name(recipe)).exists():
        return
    from sparkctl.recipe.loader import resolve_source

    resolve_source(recipe)


def ready_for_chat(st: ServerState) -> None:
    """Say why a server cannot answer (stopped, still starting) instead of a bare 'connection refused'."""
    from sparkctl.server.client import probe_health

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


def chat_target(recipe: str | None) -> ServerState:
    """The server `chat` talks to: RECIPE's, or the only one running; checked ready to answer."""
    if recipe is None:
        running = state_files.load_all()
        if len(running) != 1:
            names = ", ".join(s.recipe for s in running) or "none"
            raise UserError(f"name the recipe to chat with (running: {names})")
        st = running[0]
    else:
        found = find_state(recipe)
        if found is None:
            raise UserError(f"{recipe} is not running", hint=f"start it: sparkctl up {recipe}")
        st = found
    ready_for_chat(st)
    return st


def unrecorded(recipe: str | None = None) -> list[ServerState]:
    """Servers sparkctl started (found by their process marker) that no readable state file records: the
    file was deleted, truncated or overwritten. A damaged record must never hide a running server."""
    from sparkctl.runtimes import identity

    states = state_files.load_all()
    recorded = {s.extra.get("marker") for s in states}
    containers = {s.container_id for s in states} | {s.container_name for s in states}
    found = [identity.recovered_state(m) for m in identity.marked_servers() if m.marker not in recorded]
    found += [
        s
        for s in identity.labelled_containers()
        if s.container_id not in containers and s.container_name not in containers
    ]
    if recipe is not None:
        names = {recipe, recipe_name(recipe)}
        found = [s for s in found if s.recipe in names]
    return found


def damaged_records(recipe: str | None = None) -> list[str]:
    """One line per state file that is not a server record (what `status` says about it)."""
    out = []
    for path, problem in state_files.damaged():
        if recipe is None or path.stem in {recipe, recipe_name(recipe)}:
            out.append(f"state file {path} is damaged ({problem}); `sparkctl down {path.stem}` sets it aside")
    return out


def status_rows(recipe: str | None = None) -> list[dict[str, Any]]:
    """One record per recorded server, with a live health probe and its memory in use; servers found by
    their marker alone (state file gone or damaged) too, with an `error` that says so."""
    from sparkctl.server.client import probe_health

    states = state_files.load_all() + unrecorded()
    if recipe is not None:
        names = {recipe, recipe_name(recipe)}
        states = [s for s in states if s.recipe in names]
    rows: list[dict[str, Any]] = []
    for st in states:
        err: str | None = None
        parts: list[dict[str, Any]] = []
        if st.extra.get("recovered"):
            by = "container labels" if st.extra["recovered"] == "label" else "process marker"
            err = f"found by its {by}: its state file is missing or damaged"
        try:
            rt = get_runtime(st.runtime)
            parts = rt.parts(st)  # a cluster's parts on each node; [] for one server here
            running = all(p["running"] for p in parts) if parts else rt.is_running(st)
            # also when the API server is gone: engine processes that outlive it still hold the memory
            stats = rt.stats(st)
        except RuntimeFailure as exc:  # e.g. the Docker daemon went away
            running, stats, err = False, None, str(exc)
        if not running:
            # `orphaned`: the API server died (SIGKILL, OOM) but its engine core / workers live on, holding
            # memory and shared-memory segments; `down` (or the next `up`) reaps them
            health = "orphaned" if (stats or {}).get("processes") else "stopped"
            if health == "stopped":
                stats = None
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
            | ({"nodes": parts} if parts else {})
        )
    return rows


def to_stop(recipe: str | None, all_: bool) -> list[ServerState]:
    """What `down RECIPE` / `down --all` stops; [] when nothing runs (a misspelt RECIPE is a UserError)."""
    if all_ and recipe:
        raise UserError("give a RECIPE or --all, not both")
    if all_:
        return state_files.load_all()
    if not recipe:
        raise UserError("name the recipe to stop, or use --all", hint="see what runs: sparkctl status")
    found = find_state(recipe)
    if found is None:
        known_recipe(recipe)  # a typo must not read as "stopped"
        return []
    return [found]


def stop(st: ServerState, *, timeout_s: float = 30.0) -> str | None:
    """Stop the server and forget it (the state file goes only once it is stopped).

    Returns a note when what was stopped were orphans: engine processes whose API server had died."""
    from sparkctl import watchdog

    watchdog.stop(st)
    rt = get_runtime(st.runtime)
    note = None
    if not rt.is_running(st):
        procs = (rt.stats(st) or {}).get("processes")
        if procs:
            note = (
                f"its API server was gone; reaped {procs} orphaned engine process(es) and their shared memory"
            )
        elif st.runtime == "native":  # a stale or foreign record: said, not reported as a stop
            note = "nothing of it was running: no live process of ours matched its record, which is removed"
    rt.stop(st, timeout_s=timeout_s)
    state_files.remove(st.recipe)
    return note


def log_lines(recipe: str, *, tail: int | None = None, follow: bool = False) -> Iterator[str]:
    """The server log of RECIPE; also after a failed `up` or a `down` (the last log is kept)."""
    st = find_state(recipe)
    if st is not None:
        return get_runtime(st.runtime).logs(st, tail=tail, follow=follow)
    from sparkctl.runtimes.native import follow_file

    path = state_files.log_path(recipe_name(recipe))
    if not path.exists():
        raise UserError(f"no logs for {recipe}: it is not running and has not run", hint="sparkctl status")
    return follow_file(path, tail=tail)


@dataclass(frozen=True)
class Stopped:
    """One recipe `down` dealt with: stopped (with a note on what was special), or the error it hit."""

    recipe: str
    note: str | None = None
    error: RuntimeFailure | None = None
    nodes: int = 1  # how many machines it ran on


def down(recipe: str | None, all_: bool, *, timeout_s: float = 30.0) -> list[Stopped]:
    """`down RECIPE` / `down --all`, each recipe under its lock (state.stopping): an `up` still starting
    it is interrupted and waited for first, so its server is stopped, never left behind. [] when
    nothing runs (a misspelt RECIPE is a UserError)."""
    if all_ and recipe:
        raise UserError("give a RECIPE or --all, not both")
    from sparkctl.runtimes import systemd

    if all_:
        names = sorted(
            {s.recipe for s in state_files.load_all()}
            | {s.recipe for s in unrecorded()}
            | {path.stem for path, _ in state_files.damaged()}
            | set(state_files.locked_recipes())
            | set(systemd.persisted_recipes())
        )
    elif not recipe:
        raise UserError("name the recipe to stop, or use --all", hint="see what runs: sparkctl status")
    else:
        names = [recipe]
    done: list[Stopped] = []
    for name in names:
        key = recipe_name(name)
        try:
            with state_files.stopping(key, wait_s=timeout_s + 30.0) as interrupted:
                damaged = None
                try:
                    found = find_state(name)
                except RuntimeFailure as exc:  # the record is not trusted; the server is found by marker
                    found, damaged = None, exc
                    aside = state_files.set_aside(key)
                extra = [
                    s
                    for s in unrecorded(key)
                    if found is None or s.extra.get("marker") != found.extra.get("marker")
                ]
                unit = systemd.remove(key)  # `up --persist` of a native recipe: not at the next boot either
                if found is None and not extra and interrupted is None and not unit and damaged is None:
                    if not all_:
                        known_recipe(name)  # a typo must not read as "stopped"
                    continue
                note = None
                if found is not None:
                    note = stop(found, timeout_s=timeout_s)
                for st in extra:
                    get_runtime(st.runtime).stop(st, timeout_s=timeout_s)
                    note = "found by its process marker" + (f"; {note}" if note else "")
                if damaged is not None:
                    note = f"its state file was damaged: set aside as {aside}" + (f"; {note}" if note else "")
                if unit:
                    note = f"removed its systemd unit {systemd.unit_path(key)}" + (
                        f"; {note}" if note else ""
                    )
                if interrupted is not None:
                    note = f"it was still starting: interrupted its `up` (pid {interrupted})" + (
                        f"; {note}" if note else ""
                    )
                done.append(Stopped(key, note, nodes=len(found.nodes) if found and found.nodes else 1))
        except RuntimeFailure as exc:  # with --all, one unreachable server must not keep the others up
            if not all_:
                raise
            done.append(Stopped(key, error=exc))
    if all_:  # what no recipe name reaches (a file name that is no recipe's): set aside, not kept forever
        for path, problem in state_files.damaged():
            aside = state_files.set_aside(path)
            if aside is not None:
                done.append(
                    Stopped(path.stem, note=f"its state file was damaged ({problem}): set aside as {aside}")
                )
    return done
