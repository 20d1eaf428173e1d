"""From one streamed completion's timed SSE events to its per-request metrics.

Pure functions on recorded data, so every definition in the README is unit-tested on recorded
streams (multi-token chunks, empty and role-only first chunks, reasoning, usage only at the end,
no usage) without a server. The client only timestamps bytes as they arrive and hands them here.

Definitions (seconds, client clock, relative to t_send = 0):
- a *token event* is a chunk whose choice carries non-empty content, reasoning_content, reasoning,
  tool-call text (chat) or text (completions); role-only, empty and usage-only chunks are not;
- TTFT = first token event; TTFR = first event of any kind (diagnostic); E2E = last token event;
- N_out = the server's usage.completion_tokens (last usage seen); without usage the caller's
  tokenizer counts the streamed text, and failing that the token events are counted (marked);
- decode tok/s = (N_out - 1) / (t_last - t_first); TPOT = (t_last - t_first) / (N_out - 1) (from
  arrival stamps: plausibility.judge replaces or drops it when the engine's own timing exists or the
  arrivals were bunched);
- ITL = gaps between consecutive token events, each divided by the tokens that event carried when
  continuous usage gives per-chunk counts (else one per event: then it is inter-chunk latency);
- prefill tok/s = (N_in - N_cached) / TTFT.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

COUNT_SOURCES = ("usage", "continuous", "tokenizer", "chunks")


@dataclass
class TimedEvent:
    """One SSE `data:` payload and when its line arrived (perf_counter seconds, before parsing)."""

    t: float
    data: str


@dataclass
class Sample:
    """One measured request; every raw timestamp is kept so a record can be re-analysed."""

    ok: bool = True
    error: str | None = None
    ttfr_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    end_s: float | None = None  # [DONE] or end of body
    decode_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    count_source: str | None = None
    first_chunk_tokens: int | None = None
    decode_tps: float | None = None
    tpot_s: float | None = None
    prefill_tps: float | None = None
    itl_s: list[float] = field(default_factory=list)
    itl_per_token: bool = False  # True when ITL gaps were divided by per-chunk token counts
    token_times_s: list[float] = field(default_factory=list)  # each token event's time
    token_counts: list[int] = field(default_factory=list)  # tokens per token event (when known)
    n_events: int = 0
    finish_reason: str | None = None
    text: str = ""  # content + reasoning, for follow-up turns and tokenizer fallback
    content: str = ""
    reasoning_chars: int = 0
    tool_call_chars: int = 0
    t_send_abs: float | None = None  # perf_counter at send: aligns concurrent requests in a window
    server_decode_tps: float | None = None  # the engine's own per-request figure (llama.cpp timings)
    decode_source: str | None = None  # "server" or "client" (plausibility.judge)
    decode_flag: str | None = None  # why a client figure is not physical (then decode_tps is None)

    def to_json(self, *, keep_text: bool = False) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("text", "content")}
        if keep_text:
            d["content"] = self.content
        return d


def _choice_text(choice: dict[str, Any]) -> tuple[str, str, int]:
    """(content, reasoning, tool-call chars) a choice carries, for chat deltas and completions text."""
    delta = choice.get("delta")
    if delta is None:  # /v1/completions
        return (choice.get("text") or "", "", 0)
    content = delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    tool_chars = 0
    for call in delta.get("tool_calls") or []:
        fn = (call or {}).get("function") or {}
        tool_chars += len(fn.get("name") or "") + len(fn.get("arguments") or "")
    return content, reasoning, tool_chars


def parse_events(events: Iterable[TimedEvent]) -> list[tuple[float, dict[str, Any] | None]]:
    """Decode the JSON payloads; `[DONE]` becomes (t, None). Malformed JSON raises ValueError."""
    out: list[tuple[float, dict[str, Any] | None]] = []
    for ev in events:
        if ev.data.strip() == "[DONE]":
            out.append((ev.t, None))
            continue
        out.append((ev.t, json.loads(ev.data)))
    return out


def measure(
    events: Iterable[TimedEvent],
    t_send: float,
    *,
    count_tokens: Callable[[str], int] | None = None,
) -> Sample:
    """Per-request metrics from the timed events of one stream (see the module docstring)."""
    s = Sample(t_send_abs=t_send)
    parsed = parse_events(events)
    s.n_events = len(parsed)
    usage_final: dict[str, Any] | None = None
    prev_completion: int | None = None
    continuous = True  # every token event carried a cumulative usage
    texts: list[str] = []
    content: list[str] = []
    for t, data in parsed:
        rel = t - t_send
        if data is None:
            s.end_s = rel
            continue
        if s.ttfr_s is None:
            s.ttfr_s = rel
        if "error" in data and not data.get("choices"):
            err = data["error"]
            s.ok = False
            s.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
            continue
        usage = data.get("usage")
        tok_text = ""
        has_token = False
        for choice in data.get("choices") or []:
            c, r, tc = _choice_text(choice)
            if c or r or tc:
                has_token = True
            tok_text += c + r
            content.append(c)
            s.reasoning_chars += len(r)
            s.tool_call_chars += tc
            if choice.get("finish_reason"):
                s.finish_reason = choice["finish_reason"]
        if has_token:
            s.token_times_s.append(rel)
            texts.append(tok_text)
            if usage and usage.get("completion_tokens") is not None:
                cur = int(usage["completion_tokens"])
                s.token_counts.append(cur - (prev_completion or 0))
                prev_completion = cur
            else:
                continuous = False
        elif usage and usage.get("completion_tokens") is not None and s.token_times_s:
            # a continuous-usage chunk without text (e.g. the final one): keep the running total
            prev_completion = int(usage["completion_tokens"])
        if usage:
            usage_final = usage
        timings = data.get("timings")  # llama.cpp: its own per-request prompt/generation timing
        if isinstance(timings, dict) and timings.get("predicted_per_second"):
            s.server_decode_tps = float(timings["predicted_per_second"])
    s.text = "".join(texts)
    s.content = "".join(content)
    if s.end_s is None and parsed:
        s.end_s = parsed[-1][0] - t_send
    if not s.ok:
        return s
    if not s.token_times_s:
        s.ok = False
        s.error = "the stream carried no content, reasoning or tool-call text"
        return s
    s.ttft_s = s.token_times_s[0]
    s.e2e_s = s.token_times_s[-1]
    s.decode_s = s.e2e_s - s.ttft_s

    if usage_final is not None and usage_final.get("completion_tokens") is not None:
        s.completion_tokens = int(usage_final["completion_tokens"])
        s.count_source = "continuous" if continuous and s.token_counts else "usage"
    elif count_tokens is not None:
        s.completion_tokens = int(count_tokens(s.text))
        s.count_source = "tokenizer"
    else:
        s.completion_tokens = len(s.token_times_s)
        s.count_source = "chunks"
    if usage_final is not None:
        if usage_final.get("prompt_tokens") is not None:
            s.prompt_tokens = int(usage_final["prompt_tokens"])
        details = usage_final.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            s.cached_tokens = int(details["cached_tokens"])
    if not (continuous and len(s.token_counts) == len(s.token_times_s)):
        s.token_counts = []
    s.first_chunk_tokens = s.token_counts[0] if s.token_counts else None

    n = s.completion_tokens
    if n > 1 and s.decode_s > 0:
        s.decode_tps = (n - 1) / s.decode_s
        s.tpot_s = s.decode_s / (n - 1)
    gaps = [b - a for a, b in zip(s.token_times_s, s.token_times_s[1:], strict=False)]
    if s.token_counts:
        s.itl_per_token = True
        s.itl_s = [g / max(1, k) for g, k in zip(gaps, s.token_counts[1:], strict=False)]
    else:
        s.itl_s = gaps
    if s.prompt_tokens is not None and s.ttft_s > 0:
        s.prefill_tps = (s.prompt_tokens - (s.cached_tokens or 0)) / s.ttft_s
    return s


def token_timeline(sample: Sample) -> list[tuple[float, int]]:
    """(absolute time, tokens) per token event: usage deltas when known, else N spread evenly.

    Peak tok/s buckets count tokens, not chunks (one chunk holds several tokens under MTP).
    """
    if not sample.ok or not sample.token_times_s or sample.t_send_abs is None:
        return []
    base = sample.t_send_abs
    if sample.token_counts:
        return [(base + t, k) for t, k in zip(sample.token_times_s, sample.token_counts, strict=False)]
    n = sample.completion_tokens or len(sample.token_times_s)
    k = len(sample.token_times_s)
    share = [n // k + (1 if i < n % k else 0) for i in range(k)]
    return [(base + t, c) for t, c in zip(sample.token_times_s, share, strict=False)]
