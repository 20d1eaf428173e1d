"""The metric definitions on recorded SSE streams (no server).

vllm_*.jsonl were recorded from the real tiny vLLM (0.32, CPU) with the line arrival times;
synthetic_*.jsonl follow the same wire format for what the tiny model cannot produce: multi-token
(MTP) chunks, reasoning and tool-call deltas, an empty chunk before the role chunk.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.bench.stats import peak_rate, percentile, summary
from sparkctl.bench.stream import TimedEvent, measure, token_timeline

STREAMS = Path(__file__).parent / "streams"


def load(name: str) -> list[TimedEvent]:
    return [TimedEvent(**json.loads(line)) for line in (STREAMS / f"{name}.jsonl").read_text().splitlines()]


def test_real_vllm_chat_with_continuous_usage() -> None:
    ev = load("vllm_chat_continuous")
    s = measure(ev, 0.0)
    assert s.ok and s.count_source == "continuous"
    # the first event is vLLM's role chunk (content ""): it is TTFR, not TTFT
    first = json.loads(ev[0].data)["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": ""}
    assert s.ttfr_s == pytest.approx(ev[0].t)
    assert s.ttft_s == pytest.approx(ev[1].t)
    assert s.completion_tokens == 8 and s.prompt_tokens == 17
    assert s.token_counts == [1] * 8 and s.itl_per_token
    assert s.decode_tps == pytest.approx(7 / (s.token_times_s[-1] - s.token_times_s[0]))
    assert s.tpot_s == pytest.approx(1 / s.decode_tps)
    assert s.prefill_tps == pytest.approx(17 / s.ttft_s)


def test_real_vllm_chat_usage_only_in_last_chunk() -> None:
    ev = load("vllm_chat_usage_last")
    s = measure(ev, 0.0)
    assert s.count_source == "usage" and s.completion_tokens == 8
    assert s.token_counts == [] and not s.itl_per_token  # inter-chunk latency, labelled as such
    assert len(s.itl_s) == len(s.token_times_s) - 1
    # E2E is the last token event, not the usage-only chunk or [DONE]
    assert s.e2e_s < ev[-2].t and s.end_s == pytest.approx(ev[-1].t)


def test_real_vllm_chat_without_usage_counts_with_tokenizer_or_chunks() -> None:
    ev = load("vllm_chat_no_usage")
    s = measure(ev, 0.0)
    assert s.count_source == "chunks" and s.completion_tokens == len(s.token_times_s)
    assert s.prompt_tokens is None and s.prefill_tps is None
    t = measure(ev, 0.0, count_tokens=lambda text: len(text.split()) + 100)
    assert t.count_source == "tokenizer" and t.completion_tokens == len(t.text.split()) + 100


def test_real_vllm_completions_skips_empty_text_chunks() -> None:
    ev = load("vllm_completions_usage_last")
    s = measure(ev, 0.0)
    texts = [
        json.loads(e.data)["choices"][0]["text"]
        for e in ev
        if e.data != "[DONE]" and json.loads(e.data)["choices"]
    ]
    assert len(s.token_times_s) == sum(1 for t in texts if t)
    assert s.completion_tokens == 8  # from usage, though one chunk carried no text


def test_multi_token_chunks_use_usage_not_chunk_count() -> None:
    s = measure(load("synthetic_mtp_continuous"), 0.0)
    assert s.ttfr_s == pytest.approx(0.050) and s.ttft_s == pytest.approx(0.200)
    assert s.completion_tokens == 16 and s.count_source == "continuous"
    assert s.token_counts == [1, 3, 3, 3, 3, 3]
    assert s.decode_tps == pytest.approx(15 / 0.150)  # not 5 / 0.150 (one token a chunk)
    assert s.itl_s == pytest.approx([0.010] * 5)  # 30 ms gaps of 3 tokens each
    assert s.cached_tokens == 32 and s.prefill_tps == pytest.approx((40 - 32) / 0.200)
    assert sum(k for _, k in token_timeline(s)) == 16


def test_multi_token_chunks_with_usage_only_at_the_end() -> None:
    s = measure(load("synthetic_mtp_usage_last"), 0.0)
    assert s.completion_tokens == 16 and s.count_source == "usage"
    assert s.decode_tps == pytest.approx(15 / 0.150)
    assert not s.itl_per_token
    assert sum(k for _, k in token_timeline(s)) == 16  # spread over the 6 events for peak buckets


def test_reasoning_and_tool_calls_count_as_tokens_empty_and_role_chunks_do_not() -> None:
    s = measure(load("synthetic_reasoning_tools"), 0.0)
    assert s.ttfr_s == pytest.approx(0.010)
    assert s.ttft_s == pytest.approx(0.100)  # reasoning_content is the first token
    assert s.e2e_s == pytest.approx(0.180)  # the last tool-call argument chunk
    assert s.reasoning_chars == len("Let me think about it")
    assert s.tool_call_chars == len("get_weather") + len('{"city":"Oslo"}')
    assert s.finish_reason == "tool_calls"
    assert s.completion_tokens == 9


def test_error_event_and_empty_stream_are_failed_samples() -> None:
    s = measure([TimedEvent(0.1, json.dumps({"error": {"message": "boom"}}))], 0.0)
    assert not s.ok and s.error == "boom"
    e = measure([TimedEvent(0.1, "[DONE]")], 0.0)
    assert not e.ok and "no content" in (e.error or "")


def test_stats() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([1, 2, 3, 4, 5], 90) == pytest.approx(4.6)
    s = summary([3.0, 1.0, 2.0, None])
    assert s is not None and s["n"] == 3 and s["median"] == 2.0 and s["spread"] == pytest.approx(1.0)
    assert summary([]) is None
    # 10 tokens every 1/8 s for 3 s, then a burst: the best [t, t+1 s) window holds the burst
    ev = [(i * 0.125, 10) for i in range(25)] + [(3.25, 50)]
    assert peak_rate(ev) == pytest.approx(6 * 10 + 50)  # events in (2.25, 3.25]
    assert peak_rate([(0.0, 5), (0.5, 5)]) == pytest.approx(20)  # shorter than a window: tokens / span
