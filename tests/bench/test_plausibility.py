"""Per-stream decode: bunched arrivals are flagged and dropped, the engine's own figure wins."""

from __future__ import annotations

import pytest

from sparkctl.bench import plausibility, server_metrics


def _sample(t_send: float, ttft: float, gap: float, n: int = 32, *, burst: bool = False) -> dict:
    times = [ttft + (i * 1e-5 if burst else i * gap) for i in range(n)]
    if burst:  # the whole stream arrives in one late flush, 0.3 ms wide
        times = [ttft + n * gap + i * 1e-5 for i in range(n)]
        ttft = times[0]
    decode = times[-1] - times[0]
    return {
        "ok": True, "t_send_abs": t_send, "ttft_s": ttft, "e2e_s": times[-1], "completion_tokens": n,
        "decode_tps": (n - 1) / decode, "tpot_s": decode / (n - 1), "token_times_s": times, "token_counts": [],
    }  # fmt: skip


def test_a_burst_gets_the_burst_robust_estimate_and_no_figure_exceeds_the_bound() -> None:
    # 4 streams at ~100 tok/s each (400 aggregate), one of them read in a single burst
    samples = [_sample(0.001 * i, 0.05, 0.01) for i in range(3)] + [_sample(0.003, 0.05, 0.01, burst=True)]
    assert samples[-1]["decode_tps"] > 100_000
    out = plausibility.judge(samples)
    burst = samples[-1]
    assert out["bunched"] == 1 and burst["decode_source"] == "client-e2e"
    # (N - 1) / (e2e - the level's fastest TTFT): a lower bound, not the burst's 3,000,000 tok/s
    assert burst["decode_tps"] == pytest.approx(31 / (burst["e2e_s"] - 0.05))
    assert out["source"] == "client" and out["median_tps"] == pytest.approx(100, rel=0.05)
    assert all(s["decode_tps"] <= out["bound_tps"] for s in samples)


def test_a_figure_above_the_aggregate_is_flagged_and_dropped() -> None:
    samples = [_sample(0.0, 0.05, 0.01), _sample(0.0, 0.05, 0.01)]
    samples.append(_sample(0.0, 0.05, 0.01, n=3))  # 2 tokens after the first, arrival rate 100 tok/s
    samples[-1]["decode_tps"] = 5000.0  # an arrival figure no end-to-end time contradicts
    samples[-1]["e2e_s"] = 0.0504
    out = plausibility.judge(samples)
    assert out["nonphysical"] == 1 and samples[-1]["decode_tps"] is None
    assert samples[-1]["decode_flag"] == plausibility.FLAG_FAST and out["client"]["n"] == 2


def test_concurrency_one_keeps_every_honest_stream() -> None:
    samples = [_sample(i * 1.0, 0.02, g) for i, g in enumerate((0.0019, 0.002, 0.0021, 0.002))]
    out = plausibility.judge(samples)
    assert out["nonphysical"] == 0 and out["median_tps"] == pytest.approx(500, rel=0.05)


def test_the_engines_own_figures_win() -> None:
    samples = [_sample(0, 0.05, 0.01) for _ in range(2)]
    samples[0]["server_decode_tps"] = 97.0  # llama.cpp's timings.predicted_per_second
    out = plausibility.judge(samples)
    assert samples[0]["decode_source"] == "server" and samples[0]["decode_tps"] == 97.0
    assert samples[1]["decode_source"] == "client"
    # vLLM: per-request decode histograms over the level (10 requests, 31 tokens after the first each)
    text = "\n".join(
        [
            'vllm:request_decode_time_seconds_sum{model_name="m"} 3.1',
            'vllm:request_decode_time_seconds_count{model_name="m"} 10',
            'vllm:request_generation_tokens_sum{model_name="m"} 320',
        ]
        + [
            f'vllm:request_time_per_output_token_seconds_bucket{{le="{b}",model_name="m"}} {c}'
            for b, c in ((0.05, 0), (0.075, 0), (0.1, 2), (0.15, 10), ("+Inf", 10))
        ]
    )
    after = server_metrics.pick(server_metrics.parse(text), server_metrics.buckets(text))
    before = {k: 0.0 for k in after}
    d = server_metrics.delta(before, after)
    srv = d["server_decode"]
    assert srv["mean_tps"] == pytest.approx(310 / 3.1) and srv["median_from"] == "histogram"
    assert 1 / 0.15 < srv["median_tps"] < 1 / 0.1
    out = plausibility.judge([_sample(0, 0.05, 0.01)], d)
    assert out["source"] == "server" and out["median_tps"] == srv["median_tps"]


def test_coarse_buckets_fall_back_to_the_exact_mean() -> None:
    hist = {0.01: 8.0, 0.025: 8.0, float("inf"): 8.0}  # a 2 ms TPOT: all in the first bucket [0, 10 ms]
    assert server_metrics.quantile(hist, 0.5) is None
    d = {"decode_requests": 8, "decode_time_s": 0.5, "request_generation_tokens": 8 * 126}
    srv = server_metrics.server_decode(d)
    assert srv["median_from"] == "mean" and srv["median_tps"] == pytest.approx(1000 / 0.5)


def test_union_length() -> None:
    assert plausibility.union_length([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)


def test_a_burst_with_the_engines_figure_carries_the_engines_mean() -> None:
    samples = [_sample(0.0, 0.05, 0.01), _sample(0.001, 0.05, 0.01, burst=True)]
    d = {"server_decode": {"requests": 2, "mean_tps": 98.0, "median_tps": 98.0, "median_from": "mean"}}
    out = plausibility.judge(samples, d)
    assert samples[1]["decode_source"] == "server-mean" and samples[1]["decode_tps"] == 98.0
    assert samples[0]["decode_source"] == "client" and out["bunched"] == 1 and out["nonphysical"] == 0
    assert out["source"] == "server" and out["client"]["n"] == 1
