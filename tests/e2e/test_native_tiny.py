"""End to end with the real vLLM on the CPU: `up tiny` -> status -> streamed chat -> logs -> up again ->
port clash -> down -> nothing left. One server start for the whole module (see conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from procs import gone

from sparkctl.server.client import stream_chat

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]


def test_up_reports_a_healthy_smoke_tested_endpoint(tiny_server):
    up = tiny_server.up
    assert up["recipe"] == "tiny" and up["runtime"] == "native"
    assert up["base_url"] == f"http://127.0.0.1:{tiny_server.port}"
    assert up["model"] == "tiny"
    assert up["smoke_tokens"] >= 1
    assert 0 < up["seconds_to_healthy"] < tiny_server.wall_s
    for stage in ("validate", "doctor", "fetch", "prewarm", "launch", "health", "smoke"):
        assert stage in up["timings_s"], stage
        assert f"✓ {stage}" in tiny_server.up_stderr
    # The Spark load path: shards warmed by 8 workers, then evicted once the server held them.
    assert "GiB/s, 8 workers), 100% cached" in tiny_server.up_stderr
    assert (
        "✓ evict    shards dropped from the page cache after load (0% still cached" in tiny_server.up_stderr
    )
    print(f"\nup tiny: healthy after {up['seconds_to_healthy']:.1f}s (wall {tiny_server.wall_s:.1f}s)")


def test_status_shows_it_healthy_with_its_memory(tiny_server):
    res = tiny_server.sparkctl("status", "--json")
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)
    assert row["recipe"] == "tiny" and row["runtime"] == "native" and row["port"] == tiny_server.port
    assert row["health"] == "healthy"
    assert row["pid"] == tiny_server.up["pid"]
    assert row["memory_bytes"] > 200 * 2**20  # API server + engine core with torch loaded
    assert row["uptime_s"] > 0
    table = tiny_server.sparkctl("status")
    assert "tiny" in table.stdout and "healthy" in table.stdout and str(tiny_server.port) in table.stdout


def test_streamed_chat_completion(tiny_server):
    base = tiny_server.up["base_url"]
    pieces = list(stream_chat(base, "tiny", "Tell me about the sea.", max_tokens=12, temperature=1.0))
    assert len(pieces) >= 2  # arrived as several SSE events, not one body
    assert all(isinstance(p, str) for p in pieces)
    # And through the CLI: `sparkctl chat` streams to stdout.
    res = tiny_server.sparkctl("chat", "tiny", "-m", "Hello!", "--max-tokens", "8")
    assert res.returncode == 0, res.stderr
    assert "chunk(s) in" in res.stderr
    # Non-streamed usage must agree that tokens were generated.
    r = httpx.post(
        f"{base}/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 5,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


def test_logs_tail_and_the_log_file(tiny_server):
    res = tiny_server.sparkctl("logs", "tiny", "--tail", "5")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 5
    everything = tiny_server.sparkctl("logs", "tiny").stdout
    assert everything.startswith("# sparkctl: starting tiny: ")
    assert "POST /v1/chat/completions" in everything  # the smoke test and our chats were served
    assert Path(tiny_server.up["log_path"]).is_file()


def test_logs_follow_shows_new_requests_as_they_happen(tiny_server):
    follow = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "logs", "tiny", "--follow", "--tail", "0"],
        env=tiny_server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in follow.stdout], daemon=True).start()
    try:
        time.sleep(1.5)  # let it reach the end of the file
        httpx.get(f"{tiny_server.up['base_url']}/v1/models", timeout=10)
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while not any('"GET /v1/models HTTP/1.1" 200' in x for x in seen):
            assert time.monotonic() < deadline, f"logs -f never showed the request: {seen}"
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=0.5))
        assert follow.poll() is None  # still following: the server runs
    finally:
        follow.terminate()
        follow.wait(timeout=10)


def test_up_again_is_idempotent(tiny_server):
    res = tiny_server.sparkctl("up", "tiny", "--port", str(tiny_server.port), "--json")
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)
    assert again["already_running"] is True
    assert again["pid"] == tiny_server.up["pid"]
    text = tiny_server.sparkctl("up", "tiny", "--port", str(tiny_server.port))
    assert "tiny is already up" in text.stdout
    # Without a port the recipe's is only a default: the running server is the answer.
    default = tiny_server.sparkctl("up", "tiny")
    assert default.returncode == 0 and "tiny is already up" in default.stdout, default.stderr
    assert f"already running on port {tiny_server.port}" in default.stderr
    # A port asked for by name where nothing will answer is an error, and nothing moves.
    elsewhere = tiny_server.sparkctl("up", "tiny", "--port", str(tiny_server.port + 1))
    assert elsewhere.returncode == 2, elsewhere.stderr
    assert (
        f"error: tiny is already running on port {tiny_server.port}, not {tiny_server.port + 1}"
        in elsewhere.stderr
    )
    assert "hint: use http://127.0.0.1:" in elsewhere.stderr
    assert tiny_server.sparkctl("status", "tiny", "--json").stdout.count(f'"port": {tiny_server.port}') == 1


def test_another_recipe_on_the_same_port_is_refused_by_name(tiny_server, tmp_path):
    other = tmp_path / "tiny-b.yaml"
    other.write_text(f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: tiny-b\n")
    res = tiny_server.sparkctl("up", str(other), "--port", str(tiny_server.port))
    assert res.returncode == 2
    assert f"port {tiny_server.port} is taken by recipe tiny (pid {tiny_server.up['pid']})" in res.stderr
    assert "sparkctl down tiny" in res.stderr
    assert not (tiny_server.state_dir / "servers" / "tiny-b.json").exists()


def test_down_leaves_nothing_behind(tiny_server):
    """Last in the module: it stops the shared server."""
    pid = tiny_server.up["pid"]
    group = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == pid]
    assert len(group) >= 2  # the API server and vLLM's engine core
    res = tiny_server.sparkctl("down", "tiny")
    assert res.returncode == 0 and "stopped tiny" in res.stdout
    assert all(gone(p) for p in group)
    assert list((tiny_server.state_dir / "servers").iterdir()) == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{tiny_server.up['base_url']}/health", timeout=2)
    status = tiny_server.sparkctl("status", "--json")
    assert json.loads(status.stdout) == []
    again = tiny_server.sparkctl("down", "tiny")
    assert again.returncode == 0 and "tiny is not running" in again.stdout


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
