"""The community T1 speed protocol (`bench --profile t1`), runnable in pieces and resumable.

T1 as the Spark recipe repositories publish it (llama-benchy 0.4.0): prompts {128, 4096} x outputs
{256, 1024} x depth {0, 32K, 131K} x concurrency {1, 4, 8}, 3 runs after a warm-up, thinking off,
end-to-end TTFT. Depth is a filler prefix in front of the prompt; every request opens with a fresh
nonce, so no run can reuse another's prefix from the cache (prefix hashing starts at token 0) and
each run pays its whole depth + prompt prefill, as the protocol means. Each task's figures are
llama-benchy's fields (so `bench compare` reads ours against theirs) plus the per-stream decode
judged as in plausibility.py.

A T1 run is long (131K prefills): the record is saved after every batch, and `--resume FILE` runs
only the tasks (and runs) it does not hold yet. `--profile-set KEY=V1,V2` scales the grid down
(prompts, outputs, depths, concurrency, runs) for a small model or a quick look; the record names
the profile "t1 (modified)" then, so it is never mistaken for the published one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sparkctl.bench import plausibility, prompts, server_metrics
from sparkctl.bench.client import BenchInputError, request_body
from sparkctl.bench.load import run_batch

KEYS = ("prompts", "outputs", "depths", "concurrency", "runs")


@dataclass(frozen=True)
class Profile:
    name: str
    prompts: tuple[int, ...]
    outputs: tuple[int, ...]
    depths: tuple[int, ...]
    concurrency: tuple[int, ...]
    runs: int
    thinking: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "prompts": list(self.prompts),
            "outputs": list(self.outputs),
            "depths": list(self.depths),
            "concurrency": list(self.concurrency),
            "runs": self.runs,
            "thinking": self.thinking,
            "tool": "llama-benchy 0.4.0 protocol",
        }

    def tasks(self) -> list[dict[str, int]]:
        """Depth outermost (its filler is sized once), then prompt, output, concurrency."""
        return [
            {"depth": d, "pp": p, "tg": t, "concurrency": c}
            for d in self.depths
            for p in self.prompts
            for t in self.outputs
            for c in self.concurrency
        ]


T1 = Profile(
    name="t1",
    prompts=(128, 4096),
    outputs=(256, 1024),
    depths=(0, 32768, 131072),
    concurrency=(1, 4, 8),
    runs=3,
)
PROFILES = {"t1": T1}


def task_key(t: dict[str, Any]) -> str:
    return f"d{t['depth']}/pp{t['pp']}/tg{t['tg']}/c{t['concurrency']}"


def get_profile(name: str, sets: tuple[str, ...] = ()) -> Profile:
    """The named profile, scaled by KEY=V1,V2 settings (a scaled profile says it was modified)."""
    if name not in PROFILES:
        raise BenchInputError(f"unknown profile {name!r}", hint=f"known: {', '.join(PROFILES)}, arena-v2")
    p = PROFILES[name]
    changes: dict[str, Any] = {}
    for spec in sets:
        key, sep, vals = spec.partition("=")
        if not sep or key not in KEYS:
            raise BenchInputError(f"--profile-set {spec!r} is not KEY=V1,V2", hint=f"keys: {', '.join(KEYS)}")
        try:
            nums = tuple(int(v) for v in vals.split(",") if v.strip())
        except ValueError as exc:
            raise BenchInputError(f"--profile-set {spec!r}: the values must be integers") from exc
        if not nums or min(nums) < (0 if key == "depths" else 1):
            raise BenchInputError(f"--profile-set {spec!r}: give at least one value, each >= 1 (depth >= 0)")
        changes[key] = nums[0] if key == "runs" else nums
    if not changes:
        return p
    return replace(p, name=f"{p.name} (modified)", **changes)


def select(
    name: str | None,
    sets: tuple[str, ...],
    workloads: tuple[str, ...],
    workloads_given: bool,
    grid: str | None,
    *,
    resume: Any = None,
) -> tuple[tuple[str, ...], Profile | None, str | None]:
    """`--profile` into (workloads, T1 profile, grid name): arena-v2 is the grid, t1 adds the t1 workload."""
    if name == "arena-v2":
        return workloads, None, "arena-v2"
    profile = get_profile("t1", sets) if name == "t1" else None
    if profile is not None:
        workloads = (*workloads, "t1") if workloads_given else ("t1",)
    if resume and profile is None:
        raise BenchInputError(
            "--resume completes a --profile t1 run", hint="add --profile t1 (and its --profile-set)"
        )
    if sets and profile is None:
        raise BenchInputError("--profile-set scales --profile t1", hint="add --profile t1")
    return workloads, profile, grid


def _messages(tag: str, context: str, prompt: str) -> list[dict[str, Any]]:
    head = f"[run {tag}] "  # the nonce comes first: no prefix of this request was ever sent before
    body = f"{context}\n{prompt}" if context else prompt
    return [{"role": "user", "content": f"{head}{body}\n{prompts.ARENA_PROMPT}"}]


def body_for(
    ctx: Any, task: dict[str, Any], text_of: Callable[[int, int, bool], str], i: int
) -> dict[str, Any]:
    context = text_of(task["depth"], 100 + i, False) if task["depth"] else ""
    msgs = _messages(prompts.nonce(), context, text_of(task["pp"], 7 + i, True))
    body = request_body(ctx.target, msgs, task["tg"])
    if ctx.target.api == "chat" and not ctx.cfg.profile.thinking:
        body["chat_template_kwargs"] = {"enable_thinking": False}  # T1: thinking off
    return body


def collect(ctx: Any, section: dict[str, Any]) -> None:
    """Run every task's missing runs (a resumed section keeps what it holds)."""
    from sparkctl.bench.workloads import _sj, measure_latency, sized_text

    p: Profile = ctx.cfg.profile
    section["profile"] = p.to_json()
    section.setdefault("tasks", [])
    worst = max(p.depths) + max(p.prompts) + max(p.outputs) + 64
    ctx.check_fits(worst - ctx.cfg.max_tokens, f"T1 depth {max(p.depths)} + prompt {max(p.prompts)} + output")
    if section.get("latency_s") is None:
        section["latency_s"] = measure_latency(ctx)
    have = {task_key(t): t for t in section["tasks"]}
    cache: dict[tuple[int, int, bool], str] = {}

    def text_of(tokens: int, seed: int, whole: bool) -> str:
        """Filler of `tokens`; for the prompt (whole) the request around it counts too (nonce, template)."""
        if (tokens, seed, whole) not in cache:
            if whole:
                wrap: Callable[[str], Any] = lambda t: _messages(prompts.nonce(), "", t)  # noqa: E731
            else:
                wrap = lambda t: t  # noqa: E731  (the raw text: its tokens are the depth)
            cache[(tokens, seed, whole)] = sized_text(ctx, tokens, seed, wrap)[0]
        return cache[(tokens, seed, whole)]

    resumed = 0
    for spec in p.tasks():
        key = task_key(spec)
        task = have.get(key)
        if task is None:
            task = {"key": key, **spec, "runs": []}
            section["tasks"].append(task)
            have[key] = task
        elif task["runs"]:
            resumed += 1
        while len(task["runs"]) < p.runs:
            if ctx.stop.is_set():
                raise KeyboardInterrupt
            bodies = [body_for(ctx, spec, text_of, i) for i in range(spec["concurrency"])]
            section.setdefault("request_example", {k: v for k, v in bodies[0].items() if k != "messages"})
            before = ctx.metrics()
            batch = run_batch(ctx.target, bodies, count_tokens=ctx.count_tokens, stop=ctx.stop)
            task.setdefault("server_metrics", []).append(server_metrics.delta(before, ctx.metrics()))
            for s in batch:
                if not s.ok and s.error and "context" in s.error.lower():
                    raise BenchInputError(f"T1 task {key} does not fit the model: {s.error}")
            task["runs"].append([_sj(s) for s in batch])
            ctx.progress.advance()
            if ctx.save is not None:
                ctx.save()  # a long T1 run can be resumed from any batch
    section["resumed_tasks"] = resumed


def finish(section: dict[str, Any], slo: dict[str, float]) -> None:
    from sparkctl.bench.workloads import _batch_metrics

    lat = section.get("latency_s") or 0.0
    for t in section.get("tasks", []):
        sm = t.get("server_metrics") or [None] * len(t["runs"])
        checks = [plausibility.judge(b, m) for b, m in zip(t["runs"], sm, strict=False)]
        t["nonphysical"] = sum(c["nonphysical"] for c in checks)
        # no prefix cache reuse: the whole depth + prompt is prefilled, as llama-benchy counts it
        t.update(_batch_metrics(t["runs"], t["depth"] + t["pp"], lat, uncached_pp=False))
        meds = [c["median_tps"] for c in checks if c["median_tps"]]
        t["per_stream_decode_tps"] = sorted(meds)[len(meds) // 2] if meds else None


def planned(p: Profile) -> int:
    return len(p.tasks()) * p.runs
