"""Benchmark of `sparkctl bench`'s client: decode tok/s against a server of known rate, and overhead.

    python bench/bench_client.py [--interval-ms 5] [--tokens 200] [--requests 10]

Starts bench/fixed_rate_server.py in its own process (so it does not share the client's GIL), sends
streamed requests through sparkctl.bench.client.timed_request exactly as `sparkctl bench` does, and
reports for each request the measured decode tok/s against the rate the server really sent
((N-1) / (last send - first send), server-side perf_counter), plus the client's overhead per
chunk: the delay from the server's write to the client's timestamp (loopback + httpx + line
splitting) and the cost of turning the events into metrics (JSON parse + measure). Results go in
bench/PERF.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkctl.bench.client import Target, request_body, timed_request  # noqa: E402
from sparkctl.bench.stream import TimedEvent, measure  # noqa: E402


def start_server(interval_s: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("fixed_rate_server.py")), str(interval_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    return proc, url


def parse_cost_per_chunk(n: int, repeats: int = 20) -> float:
    """Seconds per chunk for JSON parsing + metric computation, on chunks shaped like vLLM's."""
    chunk = json.dumps({"id": "chatcmpl-x", "object": "chat.completion.chunk", "model": "m",
                        "choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}]})  # fmt: skip
    events = [TimedEvent(i * 0.001, chunk) for i in range(n)]
    events.append(
        TimedEvent(
            n * 0.001, json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}})
        )
    )
    t = time.perf_counter()
    for _ in range(repeats):
        measure(events, 0.0)
    return (time.perf_counter() - t) / repeats / n


def run(interval_s: float, tokens: int, requests: int) -> dict[str, Any]:
    proc, url = start_server(interval_s)
    try:
        target = Target(base_url=url, model="fake", continuous_usage=False)
        http = target.new_http()
        http.get("/v1/models")
        rows = []
        for _ in range(requests + 1):  # the first one warms the connection and the imports
            s = timed_request(http, target, request_body(target, "hi", tokens))
            sent = httpx.get(f"{url}/times").json()["times"]
            truth = (len(sent) - 1) / (sent[-1] - sent[0])
            recv = [s.t_send_abs + t for t in s.token_times_s]
            delays = [r - w for r, w in zip(recv, sent, strict=True)]
            rows.append({"measured_tps": s.decode_tps, "true_tps": truth,
                         "error_pct": 100 * (s.decode_tps - truth) / truth,
                         "median_delay_ms": 1000 * statistics.median(delays),
                         "p90_delay_ms": 1000 * sorted(delays)[int(0.9 * (len(delays) - 1))]})  # fmt: skip
        rows = rows[1:]
        http.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return {
        "interval_ms": interval_s * 1000,
        "nominal_tps": 1 / interval_s,
        "tokens": tokens,
        "requests": requests,
        "max_abs_error_pct": max(abs(r["error_pct"]) for r in rows),
        "median_error_pct": statistics.median(r["error_pct"] for r in rows),
        "median_true_tps": statistics.median(r["true_tps"] for r in rows),
        "median_measured_tps": statistics.median(r["measured_tps"] for r in rows),
        "chunk_delay_ms_median": statistics.median(r["median_delay_ms"] for r in rows),
        "chunk_delay_ms_p90": statistics.median(r["p90_delay_ms"] for r in rows),
        "parse_us_per_chunk": 1e6 * parse_cost_per_chunk(tokens),
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run(a.interval_ms / 1000, a.tokens, a.requests)
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(
        f"fixed-rate server {res['nominal_tps']:.0f} tok/s nominal, {res['median_true_tps']:.1f} sent; "
        f"measured {res['median_measured_tps']:.1f} tok/s (median error {res['median_error_pct']:+.2f} %, "
        f"worst {res['max_abs_error_pct']:.2f} % over {a.requests} requests of {a.tokens} tokens)\n"
        f"client overhead per chunk: write->timestamp {res['chunk_delay_ms_median']:.3f} ms median "
        f"({res['chunk_delay_ms_p90']:.3f} ms p90); JSON parse + metrics {res['parse_us_per_chunk']:.1f} us"
    )


if __name__ == "__main__":
    main()
