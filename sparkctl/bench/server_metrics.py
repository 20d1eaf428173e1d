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
}
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


def pick(raw: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, names in (COUNTERS | GAUGES).items():
        for n in names:
            if n in raw:
                out[key] = raw[n]
                break
    return out


def scrape(http: httpx.Client) -> dict[str, float] | None:
    """Our selection of the server's /metrics, or None when it has none."""
    try:
        resp = http.get("/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return pick(parse(resp.text))


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any] | None:
    """Counter differences over a workload plus the derived rates it allows."""
    if before is None or after is None:
        return None
    d: dict[str, Any] = {k: after[k] - before[k] for k in COUNTERS if k in after and k in before}
    for g in GAUGES:
        if g in after:
            d[g] = after[g]
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
