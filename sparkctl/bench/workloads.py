"""The workloads: each fills a section of the record as samples arrive, then summarises it.

Collection and summary are separate so an interrupted run (Ctrl-C, an error half-way) still gets a
summary of what it measured: the runner calls `finish(name, section)` whatever happened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkctl.bench import plausibility, prompts, server_metrics
from sparkctl.bench.client import BenchInputError, Target, request_body, timed_request, tokenize_count
from sparkctl.bench.grids import Grid
from sparkctl.bench.load import closed_loop, run_batch
from sparkctl.bench.stats import mean_std_values, peak_rate, summary
from sparkctl.bench.stream import Sample, token_timeline

WORKLOADS = ("suite", "followup", "long", "concurrency", "grid", "t1")
DEFAULT_WORKLOADS = ("suite", "followup", "long", "concurrency")


@dataclass
class Config:
    max_tokens: int = 128
    warmup: int = 1
    runs: int = 3
    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    categories: tuple[str, ...] = tuple(prompts.CATEGORIES)
    followup_tokens: int | None = None  # context of the follow-up test (None: sized to the model)
    long_tokens: tuple[int, ...] = ()  # () -> one point sized to the model's context (<= 120k)
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    requests_per_level: int | None = None  # None -> max(4c, 16)
    grid: Grid | None = None
    slo: dict[str, float] = field(default_factory=dict)  # ttft_ms / tpot_ms / e2e_ms
    profile: Any = None  # t1.Profile for the "t1" workload

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["grid"] = self.grid.to_json() if self.grid else None
        d["profile"] = self.profile.to_json() if self.profile else None
        d["workloads"] = list(self.workloads)
        d["categories"] = list(self.categories)
        d["long_tokens"] = list(self.long_tokens)
        d["concurrency"] = list(self.concurrency)
        return d


class Progress:
    """Progress sink: the CLI shows a rich bar; the default says nothing."""

    def task(self, label: str, total: int) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def note(self, message: str) -> None: ...


@dataclass
class Ctx:
    target: Target
    http: httpx.Client
    cfg: Config
    max_model_len: int | None
    progress: Progress
    stop: threading.Event
    count_tokens: Callable[[str], int] | None = None
    save: Callable[[], None] | None = None  # keep the record now (long workloads save per batch)

    def request(self, messages: list[dict[str, Any]] | str, max_tokens: int | None = None) -> Sample:
        if self.stop.is_set():
            raise KeyboardInterrupt
        body = request_body(self.target, messages, max_tokens or self.cfg.max_tokens)
        return timed_request(self.http, self.target, body, count_tokens=self.count_tokens)

    def metrics(self) -> dict[str, float] | None:
        return server_metrics.scrape(self.http)

    def check_fits(self, prompt_tokens: int, what: str) -> None:
        if self.max_model_len and prompt_tokens + self.cfg.max_tokens > self.max_model_len:
            raise BenchInputError(
                f"{what} needs {prompt_tokens} prompt + {self.cfg.max_tokens} output tokens, more than the "
                f"model's context ({self.max_model_len})",
                hint="use a smaller size, or serve the model with a larger max_model_len",
            )


def _sj(s: Sample, **extra: Any) -> dict[str, Any]:
    return s.to_json() | extra


def _req_summary(samples: list[dict[str, Any]], slo: dict[str, float]) -> dict[str, Any]:
    ok = [s for s in samples if s["ok"]]
    out = {
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "ttft_s": summary(s["ttft_s"] for s in ok),
        "ttfr_s": summary(s["ttfr_s"] for s in ok),
        "e2e_s": summary(s["e2e_s"] for s in ok),
        "decode_tps": summary(s["decode_tps"] for s in ok),
        "tpot_s": summary(s["tpot_s"] for s in ok),
        "itl_s": summary(x for s in ok for x in s["itl_s"]),
        "prefill_tps": summary(s["prefill_tps"] for s in ok),
        "completion_tokens": summary(s["completion_tokens"] for s in ok),
        "prompt_tokens": summary(s["prompt_tokens"] for s in ok),
        "count_sources": sorted({s["count_source"] for s in ok if s["count_source"]}),
    }
    if slo:
        out["goodput"] = goodput(samples, slo)
    return out


def goodput(samples: list[dict[str, Any]], slo: dict[str, float]) -> dict[str, Any]:
    """Share of requests meeting every SLO, and the good requests' rate over the window."""

    def meets(s: dict[str, Any]) -> bool:
        if not s["ok"]:
            return False
        checks = {"ttft_ms": s["ttft_s"], "tpot_ms": s["tpot_s"], "e2e_ms": s["e2e_s"], "itl_ms": None}
        for key, limit in slo.items():
            v = checks.get(key)
            if key == "itl_ms":
                if s["itl_s"] and max(s["itl_s"]) * 1000 > limit:
                    return False
                continue
            if v is None or v * 1000 > limit:
                return False
        return True

    good = [s for s in samples if meets(s)]
    win = _window(samples)
    return {
        "slo": dict(slo),
        "good": len(good),
        "total": len(samples),
        "fraction": len(good) / len(samples) if samples else 0.0,
        "requests_per_s": len(good) / win if win else None,
        "tokens_per_s": sum(s["completion_tokens"] or 0 for s in good) / win if win else None,
    }


def _window(samples: list[dict[str, Any]]) -> float | None:
    ok = [s for s in samples if s["ok"] and s["t_send_abs"] is not None and s["e2e_s"] is not None]
    if not ok:
        return None
    start = min(s["t_send_abs"] for s in ok)
    end = max(s["t_send_abs"] + s["e2e_s"] for s in ok)
    return end - start if end > start else None


def _sample_from_json(d: dict[str, Any]) -> Sample:
    s = Sample()
    for k, v in d.items():
        if hasattr(s, k):
            setattr(s, k, v)
    return s


def _peak(samples: list[dict[str, Any]]) -> float | None:
    events = [e for d in samples for e in token_timeline(_sample_from_json(d))]
    return peak_rate(events)


# -- warm-up -----------------------------------------------------------------------------------------


def warmup(ctx: Ctx, section: dict[str, Any]) -> None:
    """Unmeasured requests first: the first after start-up pays compilation and graph capture."""
    section.setdefault("samples", [])
    for _ in range(ctx.cfg.warmup):
        s = ctx.request(prompts.with_nonce("Say hello in one short sentence."))
        section["samples"].append(_sj(s))
        if not s.ok:
            raise BenchInputError(f"the warm-up request failed: {s.error}")
        ctx.progress.advance()


# -- the eight-category suite ------------------------------------------------------------------------


def suite(ctx: Ctx, section: dict[str, Any]) -> None:
    section.setdefault("samples", [])
    before = ctx.metrics()
    try:
        for r in range(ctx.cfg.runs):
            for cat in ctx.cfg.categories:
                s = ctx.request(prompts.with_nonce(prompts.CATEGORIES[cat]))
                section["samples"].append(_sj(s, category=cat, run=r))
                ctx.progress.advance()
    finally:
        section["server_metrics"] = server_metrics.delta(before, ctx.metrics())


def finish_suite(section: dict[str, Any], slo: dict[str, float]) -> None:
    samples = section.get("samples", [])
    section["decode_check"] = plausibility.judge(samples, section.get("server_metrics"))
    cats = sorted({s["category"] for s in samples})
    section["per_category"] = {c: _req_summary([s for s in samples if s["category"] == c], slo) for c in cats}
    section["summary"] = _req_summary(samples, slo)
    medians = [v["decode_tps"]["median"] for v in section["per_category"].values() if v["decode_tps"]]
    ttfts = [v["ttft_s"]["median"] for v in section["per_category"].values() if v["ttft_s"]]
    section["mean_of_categories"] = {
        "decode_tps": sum(medians) / len(medians) if medians else None,
        "ttft_s": sum(ttfts) / len(ttfts) if ttfts else None,
    }
    section["prefill_crosscheck"] = _prefill_crosscheck(section)


def _prefill_crosscheck(section: dict[str, Any]) -> dict[str, Any] | None:
    """Client prefill tok/s against the engine's own (prompt tokens / prefill seconds from /metrics)."""
    sm = section.get("server_metrics") or {}
    client = (section.get("summary") or {}).get("prefill_tps") or {}
    if not sm.get("server_prefill_tps") or not client:
        return None
    ratio = client["median"] / sm["server_prefill_tps"]
    return {
        "client_median_tps": client["median"],
        "server_tps": sm["server_prefill_tps"],
        "client_over_server": ratio,
        # the client's TTFT also holds HTTP, tokenisation and scheduling, so it reads lower; a client
        # figure far above the server's means the cache or the count is wrong (the 290x trap)
        "plausible": ratio <= 1.5,
    }


# -- follow-up turn (prefix cache) --------------------------------------------------------------------


def sized_text(ctx: Ctx, n_tokens: int, seed: int, wrap: Callable[[str], Any]) -> tuple[str, int | None]:
    """Filler text whose wrapped request counts at most n_tokens, as close as a word allows.

    Counted by the server's own /tokenize (chat template included), so the prompt is the size the
    model sees, whatever its tokenizer; a binary search over the number of words needs ~log2(words)
    calls. Without /tokenize, ~12 tokens a sentence is assumed and the count is None.
    """
    base = tokenize_count(ctx.http, ctx.target, wrap(""))
    probe = prompts.filler(20, seed)
    full = tokenize_count(ctx.http, ctx.target, wrap(probe))
    if base is None or full is None or full <= base:
        return prompts.filler(max(1, n_tokens // 12), seed), None
    per_word = (full - base) / len(probe.split())
    n_sent = int((n_tokens - base) / per_word / 9 * 1.3) + 3  # ~9 words a sentence
    words = prompts.filler(n_sent, seed).split()

    def count(k: int) -> int:
        return tokenize_count(ctx.http, ctx.target, wrap(" ".join(words[:k]))) or 0

    for _ in range(20):  # too few words to pass the target: double them (same seed, same prefix)
        if count(len(words)) > n_tokens:
            break
        n_sent *= 2
        words = prompts.filler(n_sent, seed).split()
    lo, hi = 0, len(words)  # count(lo) <= n_tokens < count(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(mid) <= n_tokens:
            lo = mid
        else:
            hi = mid
    text = " ".join(words[:lo])
    return text, count(lo)


def followup(ctx: Ctx, section: dict[str, Any]) -> None:
    section.setdefault("pairs", [])
    budget = (ctx.max_model_len or 4096) - 3 * ctx.cfg.max_tokens - 64
    n_ctx = ctx.cfg.followup_tokens or max(32, min(2048, budget // 2))
    section["context_tokens_target"] = n_ctx
    for r in range(ctx.cfg.runs):
        tag = prompts.nonce()

        def wrap(text: str, tag: str = tag) -> list[dict[str, Any]]:
            return [
                {
                    "role": "system",
                    "content": f"[session {tag}] You answer questions about this document.\n{text}",
                },
                {"role": "user", "content": "What is the document about? Answer briefly."},
            ]

        text, counted = sized_text(ctx, n_ctx, seed=r, wrap=wrap)
        turn1 = wrap(text)
        ctx.check_fits((counted or n_ctx) + 2 * ctx.cfg.max_tokens, "the follow-up test")
        m0 = ctx.metrics()
        cold = ctx.request(turn1)
        m1 = ctx.metrics()
        if not cold.ok:
            section["pairs"].append({"cold": _sj(cold), "warm": None})
            continue
        turn2 = [
            *turn1,
            {"role": "assistant", "content": cold.content},
            {"role": "user", "content": prompts.FOLLOW_UPS[r % 2]},
        ]
        warm = ctx.request(turn2)
        m2 = ctx.metrics()
        section["pairs"].append(
            {
                "cold": _sj(cold),
                "warm": _sj(warm),
                "server_cold": server_metrics.delta(m0, m1),
                "server_warm": server_metrics.delta(m1, m2),
            }
        )
        ctx.progress.advance()


def finish_followup(section: dict[str, Any], slo: dict[str, float]) -> None:
    pairs = [p for p in section.get("pairs", []) if p.get("warm") and p["warm"]["ok"] and p["cold"]["ok"]]
    cold = [p["cold"]["ttft_s"] for p in pairs]
    warm = [p["warm"]["ttft_s"] for p in pairs]
    section["ttft_cold_s"] = summary(cold)
    section["ttft_warm_s"] = summary(warm)
    section["speedup"] = summary(c / w for c, w in zip(cold, warm, strict=False) if w)
    cached = [p["warm"]["cached_tokens"] for p in pairs if p["warm"]["cached_tokens"] is not None]
    prompt = [p["warm"]["prompt_tokens"] for p in pairs if p["warm"]["cached_tokens"] is not None]
    section["cached_ratio"] = sum(cached) / sum(prompt) if cached and sum(prompt) else None
    hits = sum((p.get("server_warm") or {}).get("prefix_cache_hits", 0.0) for p in pairs)
    queries = sum((p.get("server_warm") or {}).get("prefix_cache_queries", 0.0) for p in pairs)
    section["server_hit_rate"] = hits / queries if queries else None
    cold_hits = sum((p.get("server_cold") or {}).get("prefix_cache_hits", 0.0) for p in pairs)
    cold_q = sum((p.get("server_cold") or {}).get("prefix_cache_queries", 0.0) for p in pairs)
    section["server_cold_hit_rate"] = cold_hits / cold_q if cold_q else None
    # verified: the server said (usage details or /metrics) that the second turn hit the cache
    section["hit_verified"] = bool(cached) or section["server_hit_rate"] is not None
    section["summary"] = _req_summary([p["warm"] for p in pairs], slo)


# -- long prompt --------------------------------------------------------------------------------------


def long_prompt(ctx: Ctx, section: dict[str, Any]) -> None:
    section.setdefault("points", [])
    sizes = list(ctx.cfg.long_tokens)
    if not sizes:
        room = (ctx.max_model_len or 131072) - ctx.cfg.max_tokens - 16
        sizes = [min(120_000, room)]
    for n in sizes:
        ctx.check_fits(n, f"a {n}-token prompt")
    for n in sizes:
        point: dict[str, Any] = {"target_tokens": n, "samples": []}
        section["points"].append(point)
        before = ctx.metrics()
        try:
            for r in range(ctx.cfg.runs):
                tag = prompts.nonce()

                def wrap(text: str, tag: str = tag) -> list[dict[str, Any]]:
                    return [
                        {
                            "role": "user",
                            "content": f"[run {tag}] {text}\nSummarise the text above in one line.",
                        }
                    ]

                text, counted = sized_text(ctx, n, seed=1000 + r, wrap=wrap)
                point["tokenized"] = counted
                s = ctx.request(wrap(text))
                if not s.ok and s.error and "context" in s.error.lower():
                    raise BenchInputError(f"a {n}-token prompt is too long for the model: {s.error}")
                point["samples"].append(_sj(s, run=r))
                ctx.progress.advance()
        finally:
            point["server_metrics"] = server_metrics.delta(before, ctx.metrics())


def finish_long(section: dict[str, Any], slo: dict[str, float]) -> None:
    for p in section.get("points", []):
        p["summary"] = _req_summary(p["samples"], slo)
        sm = p.get("server_metrics") or {}
        p["server_prefill_tps"] = sm.get("server_prefill_tps")


# -- concurrency sweep --------------------------------------------------------------------------------


def concurrency(ctx: Ctx, section: dict[str, Any]) -> None:
    section.setdefault("levels", [])
    for c in ctx.cfg.concurrency:
        total = max(ctx.cfg.requests_per_level or max(4 * c, 16), c)
        level: dict[str, Any] = {"concurrency": c, "samples": [], "warmup": []}
        section["levels"].append(level)

        def body(i: int, cat_names: tuple[str, ...] = ctx.cfg.categories) -> dict[str, Any]:
            text = prompts.with_nonce(prompts.CATEGORIES[cat_names[i % len(cat_names)]])
            return request_body(ctx.target, text, ctx.cfg.max_tokens)

        closed_loop(
            ctx.target,
            body,
            c,
            c,
            count_tokens=ctx.count_tokens,
            stop=ctx.stop,
            on_sample=lambda s, lv=level: lv["warmup"].append(_sj(s)),
        )
        before = ctx.metrics()
        try:
            closed_loop(
                ctx.target,
                body,
                c,
                total,
                count_tokens=ctx.count_tokens,
                stop=ctx.stop,
                on_sample=lambda s, lv=level: (lv["samples"].append(_sj(s)), ctx.progress.advance()),
            )
        finally:
            level["server_metrics"] = server_metrics.delta(before, ctx.metrics())


def finish_concurrency(section: dict[str, Any], slo: dict[str, float]) -> None:
    for lv in section.get("levels", []):
        samples = lv["samples"]
        ok = [s for s in samples if s["ok"]]
        win = _window(samples)
        # the engine's own per-stream figure where /metrics has it; bunched arrivals flagged and dropped
        lv["per_stream_decode"] = plausibility.judge(samples, lv.get("server_metrics"))
        lv["summary"] = _req_summary(samples, slo)
        lv["window_s"] = win
        lv["aggregate_tps"] = sum(s["completion_tokens"] or 0 for s in ok) / win if win else None
        lv["per_stream_decode_tps"] = lv["per_stream_decode"]["median_tps"]
        lv["requests_per_s"] = len(ok) / win if win else None
        lv["peak_tps"] = _peak(ok)


# -- the arena grid -----------------------------------------------------------------------------------


def measure_latency(ctx: Ctx, n: int = 3) -> float:
    """llama-benchy's `generation` latency: mean time to first byte of tiny max_tokens=1 requests."""
    vals = []
    for _ in range(n):
        body = request_body(ctx.target, prompts.with_nonce("Hi"), 1, ignore_eos=False)
        s = timed_request(ctx.http, ctx.target, body)
        if s.ttfr_s is not None:
            vals.append(s.ttfr_s)
    return sum(vals) / len(vals) if vals else 0.0


def grid(ctx: Ctx, section: dict[str, Any]) -> None:
    g = ctx.cfg.grid
    assert g is not None
    section["grid"] = g.to_json()
    section.setdefault("tasks", [])
    worst = max(g.depths) + g.pp + 64
    ctx.check_fits(worst, f"grid depth {max(g.depths)} + pp {g.pp}")
    section["latency_s"] = measure_latency(ctx)
    ctx_cache: dict[tuple[int, int], str] = {}

    def text_of(tokens: int, seed: int, wrap: Callable[[str], Any]) -> str:
        key = (tokens, seed)
        if key not in ctx_cache:
            ctx_cache[key] = sized_text(ctx, tokens, seed, wrap)[0] if tokens > 0 else ""
        return ctx_cache[key]

    for depth, conc in g.schedule:
        task: dict[str, Any] = {
            "depth": depth,
            "concurrency": conc,
            "pp": g.pp,
            "tg": g.tg,
            "runs": [],
            "context_runs": [],
        }
        section["tasks"].append(task)
        for _ in range(g.runs):
            bodies_ctx, bodies = [], []
            for i in range(conc):
                tag = prompts.nonce()
                prompt = text_of(g.pp, 7 + i, lambda t: [{"role": "user", "content": t}])
                if depth > 0:
                    context = text_of(depth, 100 + i, lambda t: [{"role": "system", "content": t}])
                    sys_msg = {"role": "system", "content": f"[doc {tag}] {context}"}
                    bodies_ctx.append(
                        request_body(
                            ctx.target,
                            [sys_msg, {"role": "user", "content": prompts.CONTEXT_LOAD_MESSAGE}],
                            g.tg,
                        )
                    )
                    msgs = [sys_msg, {"role": "user", "content": f"{prompt}\n{prompts.ARENA_PROMPT}"}]
                else:
                    msgs = [{"role": "user", "content": f"[run {tag}] {prompt}\n{prompts.ARENA_PROMPT}"}]
                bodies.append(request_body(ctx.target, msgs, g.tg))
            if ctx.stop.is_set():
                raise KeyboardInterrupt
            if bodies_ctx and g.prefix_caching:
                task["context_runs"].append(
                    [_sj(s) for s in run_batch(ctx.target, bodies_ctx, count_tokens=ctx.count_tokens)]
                )
            task["runs"].append(
                [_sj(s) for s in run_batch(ctx.target, bodies, count_tokens=ctx.count_tokens)]
            )
            ctx.progress.advance()


def _batch_metrics(
    batches: list[list[dict[str, Any]]], expected_pp: int, latency: float, *, uncached_pp: bool
) -> dict[str, Any]:
    """llama-benchy's per-task fields (throughputs in tok/s, times in ms) from the measured batches."""
    pp_req, tg_req, ttfr, est_ppt, e2e_ttft, peak_req = [], [], [], [], [], []
    pp_tot, tg_tot, peak_tot = [], [], []
    for batch in batches:
        ok = [s for s in batch if s["ok"]]
        if not ok:
            continue
        p_sum = g_sum = 0
        for s in ok:
            pt = expected_pp
            if (
                not uncached_pp
                and s["prompt_tokens"]
                and abs(s["prompt_tokens"] - expected_pp) < 0.2 * expected_pp
            ):
                pt = s["prompt_tokens"]
            p_sum += pt
            g_sum += s["completion_tokens"] or 0
            ttfr.append(s["ttfr_s"] * 1000)
            e2e_ttft.append(s["ttft_s"] * 1000)
            ppt = max(0.0, s["ttfr_s"] - latency)
            est_ppt.append(ppt * 1000)
            if ppt > 0:
                pp_req.append(pt / ppt)
            if s["decode_tps"]:
                tg_req.append(s["decode_tps"])
            pk = peak_rate(token_timeline(_sample_from_json(s)))
            if pk and not _bunched(s):  # a burst's 1-second window says nothing about the engine
                peak_req.append(pk)
        start = min(s["t_send_abs"] for s in ok)
        first = [s["t_send_abs"] + s["ttft_s"] for s in ok]
        end = max(s["t_send_abs"] + s["e2e_s"] for s in ok)
        if max(first) > start:
            pp_tot.append(p_sum / (max(first) - start))
        # decoding starts at each stream's first token; a bunched stream's (its stamps say nothing)
        # is its last token minus its judged decode time (plausibility.judge)
        starts = [
            s["t_send_abs"] + s["e2e_s"] - ((s["completion_tokens"] or 1) - 1) / s["decode_tps"]
            if _bunched(s) and s.get("decode_tps")
            else s["t_send_abs"] + s["ttft_s"]
            for s in ok
        ]
        if end > min(starts) and g_sum > len(ok):
            tg_tot.append((g_sum - len(ok)) / (end - min(starts)))
        pk = _peak(ok)
        if pk and not any(_bunched(s) for s in ok):
            peak_tot.append(pk)
    single = all(len(b) == 1 for b in batches)
    return {
        "pp_throughput": mean_std_values(pp_req if single else pp_tot),
        "pp_req_throughput": mean_std_values(pp_req),
        "tg_throughput": mean_std_values(tg_req if single else tg_tot),
        "tg_req_throughput": mean_std_values(tg_req),
        "peak_throughput": mean_std_values(peak_req if single else peak_tot),
        "peak_req_throughput": mean_std_values(peak_req),
        "ttfr": mean_std_values(ttfr),
        "est_ppt": mean_std_values(est_ppt),
        "e2e_ttft": mean_std_values(e2e_ttft),
    }


def _bunched(s: dict[str, Any]) -> bool:
    """Were this stream's arrival stamps replaced or rejected by the plausibility check?"""
    return s.get("decode_source") in ("client-e2e", "server-mean") or bool(s.get("decode_flag"))


def finish_grid(section: dict[str, Any], slo: dict[str, float]) -> None:
    lat = section.get("latency_s") or 0.0
    prefix = (section.get("grid") or {}).get("prefix_caching", True)
    for t in section.get("tasks", []):
        t["nonphysical"] = sum(plausibility.judge(b)["nonphysical"] for b in t["runs"])
        t.update(_batch_metrics(t["runs"], t["pp"], lat, uncached_pp=prefix and t["depth"] > 0))
        if t["context_runs"]:
            t["context"] = _batch_metrics(t["context_runs"], t["depth"], lat, uncached_pp=False)


def _t1_collect(ctx: Ctx, section: dict[str, Any]) -> None:
    from sparkctl.bench import t1

    t1.collect(ctx, section)


def _t1_finish(section: dict[str, Any], slo: dict[str, float]) -> None:
    from sparkctl.bench import t1

    t1.finish(section, slo)


COLLECT = {
    "t1": _t1_collect,
    "suite": suite,
    "followup": followup,
    "long": long_prompt,
    "concurrency": concurrency,
    "grid": grid,
}
FINISH = {
    "t1": _t1_finish,
    "suite": finish_suite,
    "followup": finish_followup,
    "long": finish_long,
    "concurrency": finish_concurrency,
    "grid": finish_grid,
}


def planned_requests(cfg: Config) -> int:
    """For the progress bar: how many measured requests (or batches) the workloads will send."""
    n = cfg.warmup
    if "suite" in cfg.workloads:
        n += cfg.runs * len(cfg.categories)
    if "followup" in cfg.workloads:
        n += cfg.runs
    if "long" in cfg.workloads:
        n += cfg.runs * max(1, len(cfg.long_tokens))
    if "concurrency" in cfg.workloads:
        n += sum(max(cfg.requests_per_level or max(4 * c, 16), c) for c in cfg.concurrency)
    if "grid" in cfg.workloads and cfg.grid:
        n += len(cfg.grid.schedule) * cfg.grid.runs
    if "t1" in cfg.workloads and cfg.profile:
        n += len(cfg.profile.tasks()) * cfg.profile.runs
    return n
