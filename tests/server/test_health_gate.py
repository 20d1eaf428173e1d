"""The health gate and the log diagnosis, against a real HTTP server on a free port."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkctl.server.diagnose import diagnose, hint_for
from sparkctl.server.health import HealthTimeout, ServerExited, wait_healthy


class _Server:
    """An HTTP server whose /health and /v1/models answers the test changes while the gate polls."""

    def __init__(self) -> None:
        self.health = 503
        self.models: list[str] = []
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                outer.requests.append(self.path)
                if self.path == "/health":
                    self.send_response(outer.health)
                    self.end_headers()
                    return
                if self.path == "/v1/models":
                    body = json.dumps({"object": "list", "data": [{"id": m} for m in outer.models]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _gate(url: str, *, timeout_s: float, exit_detail=lambda: None, lines=("loading",), ticks=None):
    return wait_healthy(
        url,
        "tiny",
        label="tiny",
        timeout_s=timeout_s,
        exit_detail=exit_detail,
        last_lines=lambda n: list(lines)[-n:],
        on_tick=None if ticks is None else ticks.append,
        poll_s=0.05,
    )


def test_waits_for_health_then_for_the_model_to_be_listed(server):
    ticks = []

    def progress(tick):
        ticks.append(tick)
        if len(ticks) == 3:
            server.health = 200  # API up, model not listed yet
        if len(ticks) == 6:
            server.models = ["tiny"]

    seconds = wait_healthy(
        server.url,
        "tiny",
        label="tiny",
        timeout_s=10,
        exit_detail=lambda: None,
        last_lines=lambda n: ["INFO loading weights"],
        on_tick=progress,
        poll_s=0.05,
    )
    assert 0 < seconds < 10
    assert [t.phase for t in ticks[:3]] == ["starting"] * 3
    assert ticks[-1].phase == "loading"
    assert ticks[0].last_line == "INFO loading weights"
    assert "/v1/models" in server.requests


def test_a_stranger_serving_another_model_times_out_saying_so(server):
    server.health, server.models = 200, ["someone-else"]
    with pytest.raises(HealthTimeout, match="it serves someone-else, not tiny"):
        _gate(server.url, timeout_s=0.3)


def test_nothing_listening_times_out_with_the_log_tail():
    lines = [f"line {i}" for i in range(80)]
    with pytest.raises(HealthTimeout, match="no answer on http://127.0.0.1:9/health") as info:
        _gate("http://127.0.0.1:9", timeout_s=0.2, lines=lines)
    assert info.value.log_tail == lines[-50:]
    assert "health_timeout_s" in info.value.hint  # no known cause: the generic advice


def test_exit_is_reported_before_the_timeout():
    with pytest.raises(ServerExited, match="process exited with code 1") as info:
        _gate(
            "http://127.0.0.1:9",
            timeout_s=60,
            exit_detail=lambda: "process exited with code 1",
            lines=["ValueError: head_dim 16 is not supported"],
        )
    assert info.value.hint.startswith("unsupported head_dim")


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (
            "OSError: [Errno 98] error while attempting to bind on address: address already in use",
            "port in use",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda out of memory"),
        ("MemoryError: Cannot allocate memory", "host out of memory"),
        (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
            "kv cache",
        ),
        ("RuntimeError: No CUDA GPUs are available", "no gpu"),
        ("CUDA error: no kernel image is available for execution on the device", "wrong gpu architecture"),
        ("ModuleNotFoundError: No module named 'vllm'", "engine not installed"),
        ("huggingface_hub.errors.GatedRepoError: 401 Client Error", "gated model"),
        ("ValueError: Unknown quantization method: exl3", "unknown quantization"),
        (
            "ValueError: User-specified max_model_len (999999) is greater than the derived max_model_len",
            "context too long",
        ),
    ],
)
def test_diagnosis_patterns(line, cause):
    assert cause in [c.name for c in diagnose(["INFO starting", line])]


def test_diagnosis_does_not_overreach():
    benign = [
        "ModuleNotFoundError: No module named 'sparkctl_exl3.vllm_plugin'",  # a plugin, not vLLM itself
        "INFO Using max model len 512",
        "INFO: Application startup complete.",
    ]
    assert diagnose(benign) == []
    assert hint_for(benign, fallback="fb") == "fb"
    assert [c.name for c in diagnose(["CUDA out of memory"])] == ["cuda out of memory"]
