"""The server's own counters (Prometheus /metrics), read before and after a workload.

They cross-check the client's numbers (prefill rate from the engine's prefill time, prefix-cache hit
rate, speculative acceptance) and record KV usage per sweep variant. Missing metrics are simply
absent: llama.cpp, SGLang and vLLM name them differently and not every server exposes /metrics.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")

# our key -> Prometheus names (summed over label sets), first that is present wins
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": (
        "vllm:prompt_tokens_total",
        "sglang:prompt_tokens_total",
        "llamacpp:prompt_tokens_total",
    ),
    "generation_tokens": (
        "vllm:generation_tokens_total",
        "sglang:generation_tokens_total",
        "llamacpp:tokens_predicted_total",
    ),
    "prefill_time_s": ("vllm:request_prefill_time_seconds_sum",),
    "prefill_requests": ("vllm:request_prefill_time_seconds_count",),
    "ttft_sum_s": ("vllm:time_to_first_token_seconds_sum",),
    "ttft_count": ("vllm:time_to_first_token_seconds_count",),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "spec_drafts": ("vllm:spec_decode_num_drafts_total",),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    "requests_success": ("vllm:request_success_total",),
    # per finished request: decode seconds (first to last token, engine clock) and tokens generated
    "decode_time_s": ("vllm:request_decode_time_seconds_sum",),
    "decode_requests": ("vllm:request_decode_time_seconds_count",),
    "request_generation_tokens": ("vllm:request_generation_tokens_sum",),
}
# per-request histograms kept bucket by bucket (key -> names); flattened as "KEY_le:BOUND"
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "tpot": ("vllm:request_time_per_output_token_seconds",),
}
_BUCKET = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)_bucket\{([^}]*)\}\s+([-+0-9.eEinfNa]+)")
_LE = re.compile(r'le="([^"]+)"')
RESOLVABLE = 1.5  # a histogram quantile is used only inside a bucket whose bounds differ by at most this
GAUGES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
}


def parse(text: str) -> dict[str, float]:
    """Sum each metric name over its label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


def buckets(text: str) -> dict[str, dict[float, float]]:
    """Cumulative histogram buckets by metric name and upper bound, summed over other labels."""
    out: dict[str, dict[float, float]] = {}
    for line in text.splitlines():
        m = _BUCKET.match(line)
        if not m:
            continue
        le = _LE.search(m.group(2))
        if not le:
            continue
        try:
            bound, v = float(le.group(1)), float(m.group(3))
        except ValueError:
            continue
        h = out.setdefault(m.group(1), {})
        h[bound] = h.get(bound, 0.0) + v
    return out


def pick(raw: dict[str, float], hist: dict[str, dict[float, float]] | None = None) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, names in (COUNTERS | GAUGES).items():
        for n in names:
            if n in raw:
                out[key] = raw[n]
                break
    for key, names in HISTOGRAMS.items():
        for n in names:
            if hist and n in hist:
                out.update({f"{key}_le:{b!r}": c for b, c in hist[n].items()})
                break
    return out


def quantile(cumulative: dict[float, float], q: float) -> float | None:
    """Prometheus-style quantile (linear inside the bucket), or None when that bucket is too wide."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    lo_b, lo_c = 0.0, 0.0
    for b in bounds:
        c = cumulative[b]
        if c >= rank:
            if b == float("inf") or lo_b <= 0 or b / lo_b > RESOLVABLE:
                return None
            return lo_b + (b - lo_b) * ((rank - lo_c) / (c - lo_c) if c > lo_c else 1.0)
        lo_b, lo_c = b, c
    return None


def server_decode(d: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's own per-stream decode rate over a workload (vLLM's per-request histograms).

    The mean is exact (sum of tokens after the first over the sum of decode seconds, per finished
    request); the median and spread come from the time-per-output-token histogram only where its
    buckets resolve them (vLLM's default buckets start at 10 ms: a tiny CPU model's ~2 ms does not).
    """
    n_req = d.get("decode_requests") or 0
    secs = d.get("decode_time_s") or 0.0
    toks = d.get("request_generation_tokens")
    if not n_req or secs <= 0 or toks is None or toks - n_req <= 0:
        return None
    mean = (toks - n_req) / secs
    hist = {float(k.split(":", 1)[1]): v for k, v in d.items() if k.startswith("tpot_le:")}
    med, p10, p90 = (quantile(hist, q) for q in (0.5, 0.9, 0.1))
    return {
        "requests": int(n_req),
        "mean_tps": mean,
        "median_tps": 1.0 / med if med else mean,
        "median_from": "histogram" if med else "mean",
        "p10_tps": 1.0 / p10 if p10 else None,  # the slow tail: the 90th percentile of TPOT
        "p90_tps": 1.0 / p90 if p90 else None,
    }


def scrape(http: httpx.Client) -> dict[str, float] | None:
    """Our selection of the server's /metrics, or None when it has none."""
    try:
        resp = http.get("/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return pick(parse(resp.text), buckets(resp.text))


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any] | None:
    """Counter differences over a workload plus the derived rates it allows."""
    if before is None or after is None:
        return None
    d: dict[str, Any] = {k: after[k] - before[k] for k in COUNTERS if k in after and k in before}
    for g in GAUGES:
        if g in after:
            d[g] = after[g]
    hist = {k: after[k] - before[k] for k in after if "_le:" in k and k in before}
    d["server_decode"] = server_decode(d | hist)
    if d.get("prefill_time_s"):
        # computed (uncached) prompt tokens over the engine's prefill seconds, like the client's figure
        d["server_prefill_tps"] = (d.get("prompt_tokens", 0.0) - d.get("prefix_cache_hits", 0.0)) / d[
            "prefill_time_s"
        ]
    if d.get("prefix_cache_queries"):
        d["prefix_cache_hit_rate"] = d.get("prefix_cache_hits", 0.0) / d["prefix_cache_queries"]
    if d.get("spec_drafts"):
        d["spec_acceptance_length"] = 1.0 + d.get("spec_accepted_tokens", 0.0) / d["spec_drafts"]
    if d.get("spec_draft_tokens"):
        d["spec_acceptance_rate"] = d.get("spec_accepted_tokens", 0.0) / d["spec_draft_tokens"]
    if d.get("ttft_count"):
        d["server_mean_ttft_s"] = d.get("ttft_sum_s", 0.0) / d["ttft_count"]
    return d
