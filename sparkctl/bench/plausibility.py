"""Per-stream decode under concurrency: which figure to trust, and which samples are not physical.

A client stamps tokens when their bytes arrive. On a busy host (the 2-core CI box, a Spark whose CPU
also runs the tokenizer) a stream can sit in a socket buffer and arrive in one burst: 32 tokens
within 0.3 ms read as 100,000 tok/s from a server that decodes 500. So:

- the figure a level reports comes from the engine's own timing where it exposes it (vLLM's
  per-request decode-time and time-per-output-token histograms on /metrics; llama.cpp's
  `timings.predicted_per_second` on each response), marked `server`; otherwise from the client's
  arrival stamps, marked `client`;
- a client sample is *not physical* when its decode rate is above what the whole engine produced
  while streams were decoding (the level's aggregate decode throughput), or when most of its tokens
  arrived closer together than the engine can produce tokens at all; such samples keep their raw
  stamps (re-analysable) but lose their decode_tps/tpot_s, carry `decode_flag`, are counted per
  level, and are left out of medians and plots;
- the bound allows `SLACK` over the aggregate: at concurrency 1 every stream *is* the aggregate,
  and single requests scatter around their mean on a shared host.
"""

from __future__ import annotations

import statistics
from typing import Any

from sparkctl.bench.stats import percentile, summary

SLACK = 1.25  # a stream may read this much above the level's aggregate decode rate before it is flagged
ENGINE_SLACK = 2.0  # ... or this much above the engine's own mean per-stream rate over the same requests
FLAG_FAST = "faster than the engine's aggregate decode throughput (or twice its own per-stream rate)"
FLAG_BURST = "bunched arrivals and no end-to-end time to estimate from"


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total time covered by at least one interval."""
    total = 0.0
    end = None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _n(s: dict[str, Any]) -> int:
    return int(s.get("completion_tokens") or 0)


def aggregate_decode_tps(samples: list[dict[str, Any]], engine_rate: float | None = None) -> float | None:
    """Tokens generated after each stream's first, over the time any stream was decoding.

    The engine's generation rate while it decoded (at concurrency 1: the mean stream rate), so no
    single stream can honestly be faster. Each stream's decode interval ends at its last token and
    lasts (N - 1) / its decode_tps; a bunched stream's lasts (N - 1) / the engine's own per-stream
    rate where /metrics gives it (its stamps say nothing), else its burst-robust estimate's.
    """
    toks = 0
    spans: list[tuple[float, float]] = []
    for s in samples:
        n, rate = _n(s), s.get("decode_tps")
        if not s.get("ok") or n < 2 or not rate or s.get("t_send_abs") is None or s.get("e2e_s") is None:
            continue
        if engine_rate and s.get("decode_source") in ("client-e2e", "server-mean"):
            rate = engine_rate
        end = s["t_send_abs"] + s["e2e_s"]
        toks += n - 1
        spans.append((end - (n - 1) / rate, end))
    span = union_length(spans)
    return toks / span if span > 0 and toks else None


def _token_gaps(s: dict[str, Any]) -> list[float]:
    """Per-token arrival gaps (a multi-token chunk's gap shared by its tokens)."""
    times = s.get("token_times_s") or []
    counts = s.get("token_counts") or []
    gaps = []
    for i in range(1, len(times)):
        k = counts[i] if len(counts) == len(times) else 1
        gaps.extend([(times[i] - times[i - 1]) / max(1, k)] * max(1, k))
    n = s.get("completion_tokens") or 0
    if not counts and n > len(times) and gaps:  # usage counted more tokens than events: share them
        scale = (len(times) - 1) / (n - 1)
        gaps = [g * scale for g in gaps]
    return gaps


def judge(samples: list[dict[str, Any]], server: dict[str, Any] | None = None) -> dict[str, Any]:
    """Mark each sample's decode figure (source, flag) and summarise the level's per-stream decode.

    `server` is the level's /metrics delta (server_metrics.delta). Samples are edited in place:

    1. llama.cpp's per-response timings replace the arrival figure (decode_source `server`);
    2. a stream whose arrivals are bunched (its arrival rate above ENGINE_SLACK x the engine's own
       per-stream mean where /metrics gives it, else above SLACK x what its end-to-end time allows,
       or most of its tokens closer together than that) gets the engine's mean over the same
       requests (`server-mean`), or without /metrics the burst-robust (N - 1) / (e2e - TTFT_ref),
       TTFT_ref being the level's fastest TTFT, not this stream's bunched stamp (`client-e2e`);
    3. whatever is still faster than SLACK x the aggregate decode throughput, or ENGINE_SLACK x the
       engine's own mean per-stream rate over the same requests, is not physical:
       decode_tps = tpot_s = None, decode_flag says why, counted in `nonphysical`.
    """
    ok = [s for s in samples if s.get("ok") and _n(s) > 1 and s.get("e2e_s") is not None]
    srv = (server or {}).get("server_decode") or None
    srv_rate = srv.get("mean_tps") if srv else None
    ttfts = [s["ttft_s"] for s in ok if s.get("ttft_s") is not None]
    ttft_ref = (server or {}).get("server_mean_ttft_s") or (min(ttfts) if ttfts else 0.0)
    bursts = 0
    for s in ok:
        s["decode_flag"] = None
        if s.get("server_decode_tps"):  # the engine's own per-request timing (llama.cpp)
            s["decode_source"] = "server"
            s["decode_tps"] = s["server_decode_tps"]
            s["tpot_s"] = 1.0 / s["server_decode_tps"]
            continue
        if s.get("decode_source") in ("server", "server-mean", "client-e2e"):
            continue  # judged before (a record summarised twice)
        s["decode_source"] = "client"
        n = _n(s)
        room = s["e2e_s"] - min(ttft_ref, s.get("ttft_s") or ttft_ref)
        robust = (n - 1) / room if room > 0 else None
        # the engine's own rate is the ceiling where /metrics gives it; else what e2e allows
        ceiling = srv_rate * ENGINE_SLACK if srv_rate else (robust or 0.0) * SLACK
        arrival = s.get("decode_tps")
        gaps = _token_gaps(s)
        bunched = arrival is None or arrival > ceiling or (gaps and statistics.median(gaps) * ceiling < 1.0)
        if bunched:
            bursts += 1
            if srv_rate:  # the stamps say nothing: the engine's mean over the same requests stands in
                s["decode_source"] = "server-mean"
                s["decode_tps"] = srv_rate
                s["tpot_s"] = 1.0 / srv_rate
            else:
                s["decode_source"] = "client-e2e"
                s["decode_tps"] = robust
                s["tpot_s"] = 1.0 / robust if robust else None
    agg = aggregate_decode_tps(ok, srv_rate)
    bounds = [x for x in (agg * SLACK if agg else None, srv_rate * ENGINE_SLACK if srv_rate else None) if x]
    bound = min(bounds) if bounds else None
    nonphysical = 0
    for s in ok:
        rate = s.get("decode_tps")
        engine = s["decode_source"] in ("server", "server-mean")
        if not engine and rate is not None and bound is not None and rate > bound:
            s["decode_flag"] = FLAG_FAST
            s["decode_tps"] = s["tpot_s"] = None
            nonphysical += 1
        elif not engine and rate is None and s["decode_flag"] is None:
            s["decode_flag"] = FLAG_BURST
            nonphysical += 1
    client = [
        s["decode_tps"]
        for s in ok
        if s.get("decode_tps") is not None and s["decode_source"] in ("client", "client-e2e")
    ]
    per_req = [s["decode_tps"] for s in ok if s.get("decode_source") == "server"]
    if per_req and not srv:
        srv = {"requests": len(per_req), "mean_tps": statistics.fmean(per_req), "median_from": "responses",
               "median_tps": statistics.median(per_req), "p10_tps": percentile(per_req, 10),
               "p90_tps": percentile(per_req, 90)}  # fmt: skip
    out: dict[str, Any] = {
        "aggregate_decode_tps": agg,
        "bound_tps": bound,
        "slack": SLACK,
        "ttft_ref_s": ttft_ref,
        "bunched": bursts,  # streams whose arrival stamps were replaced by the burst-robust estimate
        "nonphysical": nonphysical,
        "client": summary(client),
        "server": srv,
    }
    if srv and srv.get("median_tps"):
        out.update(
            source="server",
            median_tps=srv["median_tps"],
            p10_tps=srv.get("p10_tps"),
            p90_tps=srv.get("p90_tps"),
        )
    elif client:
        out.update(source="client", median_tps=statistics.median(client), p10_tps=percentile(client, 10),
                   p90_tps=percentile(client, 90))  # fmt: skip
    else:
        out.update(source=None, median_tps=None, p10_tps=None, p90_tps=None)
    return out
