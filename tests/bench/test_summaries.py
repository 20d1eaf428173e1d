"""Summaries over samples: goodput under SLOs, a concurrency level's window, aggregate and peak rates."""

from __future__ import annotations

import pytest

from sparkctl.bench.stream import Sample
from sparkctl.bench.workloads import finish_concurrency, goodput


def _s(t_send: float, ttft: float, e2e: float, n: int, *, ok: bool = True) -> dict:
    times = [ttft + (e2e - ttft) * i / (n - 1) for i in range(n)]
    s = Sample(ok=ok, ttft_s=ttft, e2e_s=e2e, decode_s=e2e - ttft, completion_tokens=n, token_times_s=times,
               decode_tps=(n - 1) / (e2e - ttft), tpot_s=(e2e - ttft) / (n - 1), t_send_abs=t_send,
               itl_s=[(e2e - ttft) / (n - 1)] * (n - 1), count_source="usage")  # fmt: skip
    return s.to_json()


def test_goodput_counts_requests_meeting_every_slo() -> None:
    samples = [
        _s(0.0, 0.1, 1.1, 11),
        _s(0.0, 0.5, 1.5, 11),
        _s(1.0, 0.1, 3.1, 11),
        _s(2.0, 0.1, 1.0, 11, ok=False),
    ]
    g = goodput(samples, {"ttft_ms": 200, "tpot_ms": 150})
    assert g["good"] == 1 and g["total"] == 4 and g["fraction"] == 0.25  # 2nd: TTFT; 3rd: TPOT 300 ms
    window = 4.1 - 0.0  # first send -> last token event (the failed one does not count)
    assert g["requests_per_s"] == pytest.approx(1 / window) and g["tokens_per_s"] == pytest.approx(
        11 / window
    )
    assert goodput(samples, {"e2e_ms": 1200})["good"] == 1
    assert goodput(samples, {"itl_ms": 150})["good"] == 2


def test_concurrency_level_aggregate_per_stream_and_peak() -> None:
    # two streams, each 2 requests of 21 tokens over 1 s of decode after 0.1 s TTFT, back to back
    samples = [_s(0.0, 0.1, 1.1, 21), _s(0.0, 0.1, 1.1, 21), _s(1.1, 0.1, 1.1, 21), _s(1.1, 0.1, 1.1, 21)]
    section = {"levels": [{"concurrency": 2, "samples": samples, "warmup": []}]}
    finish_concurrency(section, {})
    lv = section["levels"][0]
    assert lv["window_s"] == pytest.approx(2.2)
    assert lv["aggregate_tps"] == pytest.approx(84 / 2.2)
    assert lv["per_stream_decode_tps"] == pytest.approx(20.0)
    assert lv["requests_per_s"] == pytest.approx(4 / 2.2)
    assert 40 <= lv["peak_tps"] <= 44  # two streams of 20 tok/s (+ one token at a window edge)
