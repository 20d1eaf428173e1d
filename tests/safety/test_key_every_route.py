"""The API key locks every route of a real vLLM (CPU, the `tiny` recipe), not only /v1.

vLLM checks its own key only under a few path prefixes; this walks every path and method that the
running server lists in its OpenAPI document and sends each one without the key, and with a wrong one:
all are refused (401) but the /health probe. With the key, the gate lets requests through.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from sparkctl_proc import run_in_env, sparkctl_env

from sparkctl.planner.keyed import KEY_GATE
from sparkctl.server import keygate
from sparkctl.server.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-every-route-" + "R" * 24


@pytest.fixture(scope="module")
def keyed_tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this Python (make install-vllm)")
    env = sparkctl_env(tmp_path_factory.mktemp("keyed-tiny"), SPARKCTL_API_KEY=KEY)
    port = free_port()
    try:
        res = subprocess.run(
            [sys.executable, "-m", "sparkctl", "up", "tiny", "--port", str(port), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
        )
        assert res.returncode == 0, res.stderr
        assert KEY not in res.stdout + res.stderr
        yield f"http://127.0.0.1:{port}", env
    finally:
        run_in_env(env, "down", "--all", timeout=120)


def _routes(base: str) -> list[tuple[str, str]]:
    spec = httpx.get(f"{base}/openapi.json", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    out = []
    for path, methods in spec["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        out += [(method.upper(), concrete) for method in methods if method != "parameters"]
    return out


def test_the_planners_flag_names_the_gate() -> None:
    assert KEY_GATE == keygate.IMPORT_PATH


def test_every_route_the_server_lists_refuses_a_request_without_the_key(keyed_tiny: tuple[str, dict]) -> None:
    base, _ = keyed_tiny
    routes = _routes(base)
    assert len(routes) > 20 and ("POST", "/tokenize") in routes  # the document is the real one
    # the docs pages themselves, which the OpenAPI document does not list
    routes += [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/")]
    open_ = []
    with httpx.Client(base_url=base, timeout=30) as http:
        for method, path in routes:
            for auth in ({}, {"Authorization": "Bearer wrong-key-0123456789"}, {"Authorization": KEY}):
                resp = http.request(method, path, headers=auth, json={"model": "tiny", "prompt": "hi"})
                if resp.status_code != 401 and path != "/health":
                    open_.append(f"{method} {path} -> {resp.status_code} {auth}")
    assert open_ == []
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200  # the documented open probe


def test_with_the_key_the_gate_lets_requests_through(keyed_tiny: tuple[str, dict]) -> None:
    base, _ = keyed_tiny
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{base}/v1/models", headers=auth, timeout=30).status_code == 200
    tok = httpx.post(f"{base}/tokenize", headers=auth, json={"model": "tiny", "prompt": "hi"}, timeout=30)
    assert tok.status_code == 200 and tok.json()["tokens"]


def test_the_key_is_in_no_argv_and_sparkctls_own_calls_still_work(keyed_tiny: tuple[str, dict]) -> None:
    base, env = keyed_tiny
    held = [
        p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if KEY in json.dumps(p.info["cmdline"])
    ]
    assert held == []
    status = run_in_env(env, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)[0]["health"] == "healthy", status.stdout
    chat = run_in_env(env, "chat", "tiny", "-m", "hi", "--max-tokens", "2", timeout=120)
    assert chat.returncode == 0, chat.stderr
    state = Path(env["SPARKCTL_STATE_DIR"])
    log = (state / "logs" / "tiny.log").read_text()
    assert "--middleware sparkctl.server.keygate.KeyGate" in log and KEY not in log  # vLLM's own log too
    files = [p for p in state.rglob("*") if p.is_file() and p.parent.name != "keys"]
    assert files and not [p for p in files if KEY in p.read_text(errors="replace")]


# llama-server lists no OpenAPI document: its routes as registered by the pinned build (tools/server)
LLAMA_ROUTES = [
    "/", "/props", "/models", "/v1/models", "/api/tags", "/api/show", "/slots", "/metrics", "/completion",
    "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions", "/v1/messages",
    "/v1/messages/count_tokens", "/infill", "/embedding", "/embeddings", "/v1/embeddings", "/rerank",
    "/reranking", "/v1/rerank", "/tokenize", "/detokenize", "/apply-template", "/lora-adapters", "/slots/0",
]  # fmt: skip


def test_every_llama_server_route_refuses_a_request_without_the_key(tmp_path: Path) -> None:
    import shutil

    from sparkctl.planner import engine_bins

    if shutil.which(engine_bins.llama_server_command("cpu")) is None:
        pytest.skip("the pinned llama-server is not built (make llama-server)")
    env = sparkctl_env(tmp_path, SPARKCTL_API_KEY=KEY)
    port = free_port()
    try:
        up = run_in_env(env, "up", "tiny-gguf", "--port", str(port), timeout=300)
        assert up.returncode == 0, up.stderr
        open_ = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for path in LLAMA_ROUTES:
                for method in ("GET", "POST"):
                    body = {"prompt": "hi", "content": "hi", "messages": [{"role": "user", "content": "hi"}]}
                    resp = http.request(method, path, json=body)
                    if resp.status_code not in (401, 404, 405):  # 404/405: no such route or method
                        open_.append(f"{method} {path} -> {resp.status_code}")
            assert open_ == []
            assert http.get("/health").status_code == 200
            auth = {"Authorization": f"Bearer {KEY}"}
            assert http.get("/v1/models", headers=auth).status_code == 200
    finally:
        run_in_env(env, "down", "--all", timeout=120)
