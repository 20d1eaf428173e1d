"""`sparkctl bench` end to end: find (or start) the server, run the workloads, keep the record.

Returns the record (a dict matching record.schema.json); the command only renders it. Whatever
stops a run (Ctrl-C, a bad-input error half-way, a server that dies), the workloads measured so far
are summarised and saved before the exception goes on, with `interrupted`/`error` set.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkctl.bench import record as records
from sparkctl.bench.client import BenchInputError, Target, normalize_url, resolve_model, server_version
from sparkctl.bench.conditions import GpuSampler, conditions
from sparkctl.bench.workloads import COLLECT, FINISH, Config, Ctx, Progress, planned_requests, warmup
from sparkctl.errors import RuntimeFailure, SparkctlError


@dataclass
class BenchOptions:
    recipe: str | None = None
    url: str | None = None
    model: str | None = None
    api_key: str | None = None
    api: str = "chat"
    overrides: tuple[str, ...] = ()
    up: bool = False
    sweep: tuple[str, tuple[str, ...]] | None = None  # (recipe path, values)
    out_dir: Path | None = None
    tokenizer: str | None = None
    timeout_s: float = 600.0
    config: Config = field(default_factory=Config)
    resume: Path | None = None  # a bench.json whose measured T1 tasks are kept (only the rest is run)
    t2: bool = False  # also run tool-eval-bench (T2) and record its score beside the speed


@dataclass
class Outcome:
    record: dict[str, Any]
    json_path: Path
    stopped_by: BaseException | None = None


def has_data(rec: dict[str, Any]) -> bool:
    """Did any workload (warm-up aside) measure anything?"""
    for v in rec.get("variants", []):
        for name, section in v.get("workloads", {}).items():
            if name == "warmup":
                continue
            if section.get("samples") or section.get("pairs") or section.get("tasks"):
                return True
            if any(p.get("samples") for p in section.get("points", []) + section.get("levels", [])):
                return True
    return False


def parse_sweep(spec: str) -> tuple[str, tuple[str, ...]]:
    """`serve.speculative.num_speculative_tokens=0,1,2,3` -> (path, values)."""
    path, sep, values = spec.partition("=")
    vals = tuple(v.strip() for v in values.split(",") if v.strip())
    if not sep or not path.strip() or not vals:
        raise BenchInputError(
            f"--sweep {spec!r} is not PATH=V1,V2,...", hint="e.g. --sweep serve.max_num_seqs=4,8"
        )
    return path.strip(), vals


def _tokenizer_counter(path: str | None) -> Callable[[str], int] | None:
    if not path:
        return None
    from tokenizers import Tokenizer

    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.exists():
        raise BenchInputError(f"no tokenizer.json at {path}")
    tok = Tokenizer.from_file(str(file))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


# -- server life cycle through the existing up/down core -------------------------------------------------


def _up(recipe: str, sets: tuple[str, ...], *, restart: bool, reporter: Any) -> Any:
    from sparkctl.recipe.overrides import Overrides
    from sparkctl.up import UpOptions, run_up

    opts = UpOptions(recipe=recipe, overrides=Overrides(sets=sets), restart=restart, smoke=False)
    return run_up(opts, reporter)


def _down(recipe_name: str) -> None:
    from sparkctl import servers

    st = servers.find_state(recipe_name)
    if st is not None:
        servers.stop(st)


def _running(recipe: str) -> Any:
    from sparkctl import servers
    from sparkctl.recipe import load_recipe

    name = load_recipe(recipe, []).name  # a typo is the loader's UserError ("did you mean")
    st = servers.find_state(name)
    if st is None:
        raise BenchInputError(
            f"recipe {name} is not running",
            hint=f"start it (sparkctl up {recipe}) or let bench do it: sparkctl bench {recipe} --up",
        )
    return st


@contextlib.contextmanager
def _served(
    opts: BenchOptions, overrides: tuple[str, ...], reporter: Any, *, restart: bool
) -> Iterator[dict[str, Any]]:
    """Yield {base_url, model, server-info} for the target; start/stop it when asked to."""
    if opts.url:
        yield {"base_url": normalize_url(opts.url), "model": opts.model or "", "server": {}}
        return
    assert opts.recipe is not None
    if opts.up or opts.sweep:
        res = _up(opts.recipe, overrides, restart=restart, reporter=reporter)
        st = res.state
        started = not res.already_running
        info = {
            "recipe": res.plan.recipe_name,
            "recipe_hash": res.plan.recipe_hash,
            "runtime": res.plan.runtime,
            "image": res.plan.container.image if res.plan.container else None,
            "overrides": list(overrides),
            "seconds_to_healthy": res.seconds_to_healthy,
            "started_by_bench": started,
        }
        try:
            yield {
                "base_url": st.base_url,
                "model": opts.model or st.served_model_name,
                "server": info,
                "api_key": _stored_key(st),
            }
        finally:
            if started or opts.sweep:
                _down(res.plan.recipe_name)
        return
    st = _running(opts.recipe)
    info = {
        "recipe": st.recipe,
        "recipe_hash": st.recipe_hash,
        "runtime": st.runtime,
        "image": st.extra.get("image") or st.container_name,
        "overrides": [],
        "started_by_bench": False,
    }
    yield {
        "base_url": st.base_url,
        "model": opts.model or st.served_model_name,
        "server": info,
        "api_key": _stored_key(st),
    }


def _verification(recipe: str | None) -> dict[str, Any] | None:
    """Which `sparkctl verify` of the recipe's pack these numbers were taken under (None: never verified)."""
    from sparkctl.verify.records import bench_summary

    return bench_summary(recipe) if recipe else None


# -- one variant -------------------------------------------------------------------------------------


def _bench_variant(
    opts: BenchOptions,
    where: dict[str, Any],
    variant: dict[str, Any],
    save: Callable[[], None],
    progress: Progress,
    stop: threading.Event,
    out_dir: Path | None = None,
) -> None:
    cfg = opts.config
    target = Target(
        base_url=where["base_url"],
        model=where["model"],
        api_key=opts.api_key or where.get("api_key"),  # --api-key, else the key `up` stored for the recipe
        api=opts.api,
        timeout_s=opts.timeout_s,
    )
    http = target.new_http()
    try:
        entry = resolve_model(http, target)
        variant["model"] = target.model
        variant["max_model_len"] = entry.get("max_model_len")
        variant["server"] = where["server"] | {
            "engine_version": server_version(http),
            "owned_by": entry.get("owned_by"),
        }
        ctx = Ctx(
            target, http, cfg, entry.get("max_model_len"), progress, stop, _tokenizer_counter(opts.tokenizer),
            save=save,
        )  # fmt: skip
        progress.task(variant["label"], planned_requests(cfg))
        wl = variant["workloads"]
        with GpuSampler() as gpu:
            wl["warmup"] = {}
            warmup(ctx, wl["warmup"])
            for name in cfg.workloads:
                section: dict[str, Any] = wl.get(name) if name == "t1" and wl.get(name) else {}  # resumed
                wl[name] = section
                progress.note(f"{variant['label']}: {name}")
                try:
                    COLLECT[name](ctx, section)
                finally:
                    FINISH[name](section, cfg.slo)
                    save()
            if opts.t2:
                from sparkctl.bench import t2

                progress.note(f"{variant['label']}: T2 (tool-eval-bench)")
                variant["t2"] = t2.run(target, out_dir=out_dir or Path("."))
        variant["continuous_usage"] = target.continuous_usage
        variant["conditions"] = conditions(
            server=where["server"],
            recipe=where["server"].get("recipe") or opts.recipe,
            engine_version=variant["server"].get("engine_version"),
            body=_example_body(ctx, wl),
            gpu=gpu.summary(),
        )
    finally:
        http.close()


def _example_body(ctx: Ctx, wl: dict[str, Any]) -> dict[str, Any]:
    """A measured request's body as sent (T1's carries its thinking switch), for the conditions block."""
    from sparkctl.bench import prompts
    from sparkctl.bench.client import request_body

    example = (wl.get("t1") or {}).get("request_example")
    return example or request_body(ctx.target, prompts.with_nonce("x"), ctx.cfg.max_tokens)


def run(opts: BenchOptions, *, progress: Progress | None = None, up_reporter: Any = None) -> Outcome:
    progress = progress or Progress()
    cfg = opts.config
    if not opts.url and not opts.recipe:
        raise BenchInputError(
            "name a RECIPE or give --url URL",
            hint="sparkctl bench tiny, or sparkctl bench --url http://127.0.0.1:8000",
        )
    if opts.sweep and not opts.recipe:
        raise BenchInputError("--sweep needs a RECIPE (each variant is started with sparkctl up)")
    name = opts.recipe or (opts.model or normalize_url(opts.url or "").split("//")[-1])
    out_dir = opts.out_dir or (opts.resume.parent if opts.resume else records.default_out_dir(name))
    json_path = out_dir / "bench.json"
    rec = records.new_record(
        target={"recipe": opts.recipe, "url": opts.url, "model": opts.model, "api": opts.api},
        config=cfg.to_json()
        | {"sweep": {"path": opts.sweep[0], "values": list(opts.sweep[1])} if opts.sweep else None},
        server={},
    )
    prior = records.resume_from(opts.resume, rec) if opts.resume else None

    def save() -> None:
        if has_data(rec):  # a run stopped before any measurement leaves no file behind
            records.save(rec, json_path)

    stop = threading.Event()
    variants: list[tuple[str, tuple[str, ...]]] = (
        [(f"{opts.sweep[0]}={v}", (*opts.overrides, f"{opts.sweep[0]}={v}")) for v in opts.sweep[1]]
        if opts.sweep
        else [("default", opts.overrides)]
    )
    stopped_by: BaseException | None = None
    t0 = time.monotonic()
    try:
        failed: list[str] = []
        for label, overrides in variants:
            variant: dict[str, Any] = {"label": label, "overrides": list(overrides), "workloads": {}}
            if prior is not None:  # --resume: the earlier run's T1 tasks of this variant are kept
                variant["workloads"] = prior.get(label, {})
            rec["variants"].append(variant)
            try:
                with _served(opts, overrides, up_reporter, restart=bool(opts.sweep)) as where:
                    rec["target"]["base_url"] = where["base_url"]
                    rec["server"] = where["server"]
                    rec["verification"] = _verification(where["server"].get("recipe"))
                    _bench_variant(opts, where, variant, save, progress, stop, json_path.parent)
            except RuntimeFailure as exc:
                if not opts.sweep:
                    raise
                # one variant that does not start (or dies) must not lose the others (sparkrun#257)
                variant["error"] = str(exc)
                failed.append(f"{label}: {exc}")
                progress.note(f"{label} failed: {exc}")
            save()
        if failed:
            raise RuntimeFailure(
                f"{len(failed)} of {len(variants)} sweep variant(s) failed: {'; '.join(failed)}"[:600],
                hint="the other variants were measured; their logs: sparkctl logs RECIPE",
            )
        rec["complete"] = True
    except KeyboardInterrupt as exc:
        stop.set()
        rec["interrupted"] = True
        stopped_by = exc
    except SparkctlError as exc:
        rec["error"] = str(exc)
        stopped_by = exc
    finally:
        rec["finished_at"] = records.now_iso()
        rec["wall_s"] = time.monotonic() - t0
        if rec["variants"] and "model" in rec["variants"][0]:
            rec["target"]["model"] = rec["variants"][0]["model"]
        save()
    return Outcome(rec, json_path, stopped_by)


def _stored_key(st: Any) -> str | None:
    """The API key `up --api-key` stored for a recipe's server (its 0600 env file), for bench's requests."""
    from sparkctl.server.auth import key_of

    return key_of(st.extra.get("api_key_file"))
