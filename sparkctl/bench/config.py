"""From what `sparkctl bench run` was asked to the BenchOptions the runner takes: the recipe's `bench:`
defaults merged under the command line, workloads, categories, the grid and the SLOs checked, each
bad value refused in one line. The command only parses options into a `BenchRequest` and renders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkctl.bench.runner import BenchOptions, parse_sweep
from sparkctl.errors import UserError

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")


@dataclass(frozen=True)
class BenchRequest:
    """The options of `sparkctl bench run` as given (None: not given, so the recipe's or the default)."""

    recipe: str | None = None
    url: str | None = None
    model: str | None = None
    api_key: str | None = None
    api: str = "chat"
    bring_up: bool = False
    sets: tuple[str, ...] = ()
    sweep: str | None = None
    workloads: str | None = None
    grid: str | None = None
    grid_depths: str | None = None
    grid_concurrency: str | None = None
    grid_pp: int | None = None
    grid_tg: int | None = None
    grid_runs: int | None = None
    max_tokens: int | None = None
    runs: int | None = None
    warmup: int | None = None
    categories: str | None = None
    levels: str | None = None
    requests: int | None = None
    long_tokens: str | None = None
    followup_tokens: int | None = None
    slo: tuple[str, ...] = ()
    tokenizer: str | None = None
    out_dir: Path | None = None
    timeout: float = 600.0
    profile: str | None = None
    profile_set: tuple[str, ...] = ()
    resume: Path | None = None
    t2: bool = False


def ints(value: str | None, what: str) -> tuple[int, ...] | None:
    """A comma list of non-negative integers (`--concurrency 1,2,4`), None when not given."""
    if value is None:
        return None
    try:
        vals = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError as exc:
        raise UserError(f"{what} takes comma-separated integers, not {value!r}") from exc
    if not vals or min(vals) < 0:
        raise UserError(f"{what} takes comma-separated non-negative integers, not {value!r}")
    return vals


def slo(values: tuple[str, ...]) -> dict[str, float]:
    """`--slo KEY=MS` values as {key: ms}."""
    out: dict[str, float] = {}
    for v in values:
        key, sep, num = v.partition("=")
        if not sep or key not in SLO_KEYS:
            raise UserError(f"--slo {v!r} is not KEY=MS", hint=f"keys: {', '.join(SLO_KEYS)}")
        try:
            out[key] = float(num)
        except ValueError as exc:
            raise UserError(f"--slo {v!r}: {num!r} is not a number") from exc
    return out


def recipe_bench_defaults(recipe: str) -> dict[str, Any] | None:
    """The recipe's `bench:` block (its own runs, max_tokens, concurrency, prompt sizes), or None."""
    from sparkctl.recipe import load_recipe

    r = load_recipe(recipe, [])  # an unknown name is the loader's one-line UserError
    return r.bench.model_dump() if getattr(r, "bench", None) is not None else None


def bench_options(req: BenchRequest) -> BenchOptions:
    """The runner's options for `req`: the command line over the recipe's `bench:` over the defaults."""
    from sparkctl.bench import grids
    from sparkctl.bench.prompts import CATEGORIES
    from sparkctl.bench.workloads import DEFAULT_WORKLOADS, WORKLOADS, Config

    if req.recipe and req.url:
        raise UserError("give a RECIPE or --url, not both")
    if (req.bring_up or req.sweep) and not req.recipe:
        raise UserError("--up and --sweep need a RECIPE")
    d = (recipe_bench_defaults(req.recipe) if req.recipe else None) or {}
    workloads = (
        tuple(w.strip() for w in req.workloads.split(",") if w.strip())
        if req.workloads
        else DEFAULT_WORKLOADS
    )
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise UserError(f"unknown workload(s): {', '.join(bad)}", hint=f"valid: {', '.join(WORKLOADS)}")
    grid = None
    from sparkctl.bench import t1

    workloads, profile, grid_name = t1.select(
        req.profile, req.profile_set, workloads, bool(req.workloads), req.grid, resume=req.resume
    )
    if grid_name or "grid" in workloads:
        grid = grids.get_grid(
            grid_name or "arena-v2",
            depths=ints(req.grid_depths, "--grid-depths"),
            concurrency=ints(req.grid_concurrency, "--grid-concurrency"),
            pp=req.grid_pp,
            tg=req.grid_tg,
            runs=req.grid_runs,
        )
        if "grid" not in workloads:
            workloads = (*workloads, "grid") if req.workloads else ("grid",)
    cats = tuple(req.categories.split(",")) if req.categories else None
    if cats and any(c not in CATEGORIES for c in cats):
        raise UserError(f"unknown category in {req.categories!r}", hint=f"valid: {', '.join(CATEGORIES)}")
    recipe_levels = tuple(d.get("concurrency") or ())
    cfg = Config(
        max_tokens=req.max_tokens or d.get("max_tokens", 128),
        warmup=req.warmup if req.warmup is not None else d.get("warmup", 1),
        runs=req.runs or d.get("runs", 3),
        workloads=workloads,
        categories=cats or tuple(CATEGORIES),
        followup_tokens=req.followup_tokens,
        long_tokens=ints(req.long_tokens, "--long-tokens") or tuple(d.get("prompt_tokens") or ()),
        concurrency=ints(req.levels, "--concurrency")
        or (recipe_levels if recipe_levels not in ((), (1,)) else (1, 2, 4, 8)),
        requests_per_level=req.requests,
        grid=grid,
        slo=slo(req.slo),
        profile=profile,
    )
    if 0 in cfg.concurrency:
        raise UserError("--concurrency levels must be at least 1")
    return BenchOptions(
        recipe=req.recipe,
        url=req.url,
        model=req.model,
        api_key=req.api_key,
        api=req.api,
        overrides=req.sets,
        up=req.bring_up,
        sweep=parse_sweep(req.sweep) if req.sweep else None,
        out_dir=req.out_dir,
        tokenizer=req.tokenizer,
        timeout_s=req.timeout,
        config=cfg,
        resume=req.resume,
        t2=req.t2,
    )


def write_outputs(rec: dict[str, Any], json_path: Path, *, html: bool = True) -> list[Path]:
    """The files next to bench.json (already saved by the runner): each variant's grid in llama-benchy's
    format, and report.html; returns every path written, bench.json first."""
    from sparkctl.bench import record as records
    from sparkctl.bench.compare import to_llama_benchy

    paths = [json_path]
    for i, v in enumerate(rec["variants"]):
        lb = to_llama_benchy(rec, i)
        if lb is not None:  # the grid also in llama-benchy's report format
            suffix = (
                ""
                if len(rec["variants"]) == 1
                else "-" + "".join(c if c.isalnum() else "_" for c in v["label"])
            )
            paths.append(records.save(lb, json_path.with_name(f"llama-benchy{suffix}.json")))
    if html:
        from sparkctl.bench.report import render_html

        paths.append(records.write_text(render_html(rec), json_path.with_name("report.html")))
    return paths


def write_compare_html(result: dict[str, Any], path: Path) -> Path:
    """`bench compare --html PATH`."""
    from sparkctl.bench import record as records
    from sparkctl.bench.report import render_compare_html

    return records.write_text(render_compare_html(result), path)
