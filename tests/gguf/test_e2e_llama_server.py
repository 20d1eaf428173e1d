"""End to end with the real llama-server on the CPU: `up tiny-gguf` and `up tiny-gguf-moe` -> status ->
chat (streamed, plain and through the CLI) -> /metrics -> logs -> bench -> down -> nothing left.

Each recipe's GGUF is generated on first use (sparkctl/models/tiny_gguf.py) and served by the pinned
llama-server build (`make llama-server`); a start takes about a second, so each recipe gets its own
server, shared by that recipe's tests. The logs prove what the planner promised: every slot gets
max_model_len (the --ctx-size fix), and --n-cpu-moe / --override-tensor placed the expert tensors.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from procs import gone
from sparkctl_proc import run_in_env

from sparkctl.server.client import stream_chat
from sparkctl.server.ports import free_port

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class GgufServer:
    recipe: str
    port: int
    env: dict[str, str]
    state_dir: Path
    up: dict
    up_stderr: str

    def sparkctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_in_env(self.env, *args, timeout=timeout)

    def log(self) -> str:
        return self.sparkctl("logs", self.recipe).stdout


@pytest.fixture(scope="module", params=["tiny-gguf", "tiny-gguf-moe"])
def server(request, llama_server: Path, tmp_path_factory) -> GgufServer:
    recipe = request.param
    root = tmp_path_factory.mktemp(f"e2e-{recipe}")
    env = {
        **os.environ,
        "SPARKCTL_STATE_DIR": str(root / "state"),
        "SPARKCTL_CACHE_DIR": str(root / "cache"),
    }
    port = free_port()
    # llama.cpp logs each tensor it places by an override at debug level (--verbose)
    debug = ["--set", 'serve.extra_args=["--verbose"]'] if recipe == "tiny-gguf-moe" else []
    res = subprocess.run(
        [sys.executable, "-m", "sparkctl", "up", recipe, "--port", str(port), "--json", *debug],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    srv = GgufServer(recipe, port, env, root / "state", {}, res.stderr)
    try:
        assert res.returncode == 0, f"sparkctl up {recipe} failed:\n{res.stderr}"
        srv.up = json.loads(res.stdout)
        yield srv
    finally:
        srv.sparkctl("down", "--all", timeout=120)


def test_up_serves_it_with_the_pinned_llama_server(server: GgufServer, llama_server: Path) -> None:
    up = server.up
    assert up["recipe"] == server.recipe and up["runtime"] == "native"
    assert up["model"] == server.recipe and up["smoke_tokens"] >= 1
    for stage in ("validate", "doctor", "fetch", "launch", "health", "smoke"):
        assert f"✓ {stage}" in server.up_stderr, stage
    assert "llama.cpp pass" in server.up_stderr  # doctor checked the binary before the launch
    assert server.log().splitlines()[0].startswith(f"# sparkctl: starting {server.recipe}: {llama_server} ")
    models = httpx.get(f"{up['base_url']}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [server.recipe]


def test_every_slot_gets_max_model_len(server: GgufServer) -> None:
    log = server.log()
    assert "n_slots = 2, n_ctx_slot = 512" in log, log[-3000:]
    unified = "true" if server.recipe == "tiny-gguf-moe" else "false"
    assert f"kv_unified = '{unified}'" in log


def test_status_shows_it_healthy(server: GgufServer) -> None:
    res = server.sparkctl("status", "--json")
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)
    assert row["recipe"] == server.recipe and row["health"] == "healthy"
    assert row["pid"] == server.up["pid"] and row["port"] == server.port
    assert row["memory_bytes"] > 0


def test_chat_streamed_plain_and_from_the_cli(server: GgufServer) -> None:
    base = server.up["base_url"]
    pieces = list(stream_chat(base, server.recipe, "Tell me about the sea.", max_tokens=12, temperature=1.0))
    assert len(pieces) >= 2 and all(isinstance(p, str) for p in pieces)
    r = httpx.post(
        f"{base}/v1/chat/completions",
        json={
            "model": server.recipe,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 5,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    res = server.sparkctl("chat", server.recipe, "-m", "Hello!", "--max-tokens", "8")
    assert res.returncode == 0 and "chunk(s) in" in res.stderr, res.stderr


def test_metrics_endpoint(server: GgufServer) -> None:
    r = httpx.get(f"{server.up['base_url']}/metrics", timeout=10)
    assert r.status_code == 200
    assert "llamacpp:prompt_tokens_total" in r.text


def test_moe_experts_were_placed_by_the_recipes_rules(server: GgufServer) -> None:
    if server.recipe != "tiny-gguf-moe":
        pytest.skip("dense model: no expert tensors")
    log = server.log()
    cmd = log.splitlines()[0]
    assert "--n-cpu-moe 1" in cmd and "--override-tensor" in cmd
    placed = set(re.findall(r"tensor (\S+) \(\d+ MiB \w+\) buffer type overridden to CPU", log))
    # layer 0 by --n-cpu-moe 1, layer 1 by the override_tensor rule; nothing else (attention stays put)
    assert placed == {f"blk.{i}.ffn_{k}_exps.weight" for i in (0, 1) for k in ("gate", "up", "down")}, log[
        -3000:
    ]


def test_bench_measures_it(server: GgufServer, tmp_path: Path) -> None:
    """`sparkctl bench` against the running llama-server: one suite prompt, a real streamed record."""
    out = tmp_path / "bench"
    res = server.sparkctl(
        "bench", "run", server.recipe, "-w", "suite", "--categories", "coding", "--runs", "1",
        "--warmup", "0", "--max-tokens", "16", "--no-html", "--out", str(out), timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    record = json.loads((out / "bench.json").read_text())
    assert record["complete"] and record["target"]["recipe"] == server.recipe
    (sample,) = record["variants"][0]["workloads"]["suite"]["samples"]
    assert sample["ok"] and sample["completion_tokens"] == 16 and sample["ttft_s"] > 0


def test_down_leaves_nothing_behind(server: GgufServer) -> None:
    """Last for each recipe: stops its server."""
    pid = server.up["pid"]
    res = server.sparkctl("down", server.recipe)
    assert res.returncode == 0 and f"stopped {server.recipe}" in res.stdout, res.stderr
    assert gone(pid)
    assert not any(p.info["ppid"] == pid for p in psutil.process_iter(["ppid"]))
    assert list((server.state_dir / "servers").iterdir()) == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.up['base_url']}/health", timeout=2)
    assert json.loads(server.sparkctl("status", "--json").stdout) == []
