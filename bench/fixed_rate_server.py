"""A fake OpenAI chat server that streams at a known, fixed token rate: the benchmark of the bench.

Only for timing `sparkctl bench`'s client (bench/bench_client.py, tests/bench/test_fake_rate.py):
it sends one token per SSE chunk every `interval_s` (busy-waiting the last stretch so the rate does
not inherit sleep overshoot), records each chunk's send time with perf_counter (CLOCK_MONOTONIC,
the same clock as the client's in another process), and serves those times at GET /times, so the
client's decode tok/s is checked against what was really sent. Modes for error tests: `plain`
(answers without streaming) and `key` (401 without the right bearer key).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _sleep_until(t: float) -> None:
    while True:
        left = t - time.perf_counter()
        if left <= 0:
            return
        if left > 0.002:
            time.sleep(left - 0.0015)


class FixedRateServer:
    def __init__(
        self, *, interval_s: float = 0.005, ttft_s: float = 0.020, mode: str = "stream", key: str = "s3cret"
    ):
        self.interval_s, self.ttft_s, self.mode, self.key = interval_s, ttft_s, mode, key
        self.times: list[float] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            # TCP_NODELAY, as uvicorn sets it for vLLM: with Nagle on, the first token waited ~20 ms for
            # the ACK of the role chunk, and every request read 3-4 % fast (t_first late, t_last not).
            disable_nagle_algorithm = True

            def log_message(self, *a: Any) -> None:
                pass

            def _json(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                if outer.mode != "key" or self.headers.get("Authorization") == f"Bearer {outer.key}":
                    return True
                self._json(401, {"error": {"message": "Unauthorized", "type": "auth"}})
                return False

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path == "/v1/models":
                    self._json(200, {"data": [{"id": "fake", "object": "model", "max_model_len": 4096}]})
                elif self.path == "/times":
                    with outer.lock:
                        self._json(200, {"times": outer.times})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                if not self._authorised():
                    return
                n = int(body.get("max_tokens") or 16)
                if outer.mode == "plain" or not body.get("stream"):
                    self._json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x " * n}}],
                                     "usage": {"prompt_tokens": 5, "completion_tokens": n}})  # fmt: skip
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def send(obj: Any) -> float:
                    payload = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
                    t = time.perf_counter()
                    self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
                    self.wfile.flush()
                    return t

                t0 = time.perf_counter()
                send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                sent: list[float] = []
                start = t0 + outer.ttft_s
                for i in range(n):
                    _sleep_until(start + i * outer.interval_s)
                    sent.append(send({"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}))
                send(
                    {
                        "choices": [],
                        "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5},
                    }
                )
                send("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                with outer.lock:
                    outer.times = sent

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FixedRateServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_subprocess(interval_s: float, mode: str = "stream") -> None:
    """`python fixed_rate_server.py INTERVAL [MODE]`: print the URL, serve until killed."""
    with FixedRateServer(interval_s=interval_s, mode=mode) as srv:
        print(srv.url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    import sys

    serve_subprocess(float(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "stream")
