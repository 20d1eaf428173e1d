"""End to end on the CPU: `sparkctl up tiny-exl3` and `sparkctl up tiny-exl3-moe` serve the EXL3 models
through the real vLLM with the plugin, and their greedy completions match the dequantized twins served
without quantization.

What "match" means, per prompt: the 32 greedy tokens are identical, and at every step the chosen
token's logprob agrees with the twin's within LOGPROB_TOL. If a prompt's tokens ever diverged, the test
accepts it only where the two models' logprobs at the first differing step agree within LOGPROB_TOL
for both candidate tokens, i.e. the twin itself had a near-tie there.

Why they can differ at all: the plugin computes ``y = ((x * suh) . H) . W_hat . H * svh`` (the factored
EXL3 forward) while the twin multiplies by the dense W reconstructed from the same tensors. Both run in
fp32, so the two differ only by fp32 rounding and summation order, around 1e-6 relative in the logits;
1e-3 in logprob is three orders of magnitude above that and far below any real loading bug (a wrong
shard, K, codebook or cut changes logits by O(1)).

Server starts are the expensive part (about a minute each on 2 cores): the two EXL3 servers start
concurrently through `sparkctl up` and are shared by the module (session fixture); the twins run in
one child process through vLLM's offline engine, which returns the same sampler output without an HTTP
server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sparkctl_proc import run_in_env as _sparkctl

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    "Hello! How can I help you today?",
    "The quick brown fox jumps over",
    "def add(a, b):",
    "A mixture of experts routes each token to",
]
MAX_TOKENS = 32
LOGPROBS = 5
LOGPROB_TOL = 1e-3
MODELS = {"tiny-exl3": "make_tiny_dense_twin", "tiny-exl3-moe": "make_tiny_moe_twin"}


@dataclass
class Served:
    recipe: str
    port: int
    up: dict
    wall_s: float


@dataclass
class Session:
    env: dict[str, str]
    servers: dict[str, Served]
    twins: dict[str, dict]  # recipe -> {"startup_s", "completions"}
    twin_wall_s: float


@pytest.fixture(scope="module")
def exl3_session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this Python (make install-vllm)")
    from sparkctl.models import tiny_exl3
    from sparkctl.server.ports import free_port

    root = tmp_path_factory.mktemp("exl3-e2e")
    env = {**os.environ, "SPARKCTL_STATE_DIR": str(root / "state"), "SPARKCTL_CACHE_DIR": str(root / "cache")}
    twin_dirs = {}
    for recipe, fn in MODELS.items():
        twin_dirs[recipe] = root / f"{recipe}-twin"
        getattr(tiny_exl3, fn)(twin_dirs[recipe])
    spec = root / "twin-spec.json"
    spec.write_text(
        json.dumps(
            {
                "models": [str(twin_dirs[r]) for r in MODELS],
                "prompts": PROMPTS,
                "max_tokens": MAX_TOKENS,
                "logprobs": LOGPROBS,
            }
        )
    )
    twin_out = root / "twin-out.json"
    ports = {recipe: free_port() for recipe in MODELS}
    t0 = time.monotonic()
    ups = {
        recipe: subprocess.Popen(
            [sys.executable, "-m", "sparkctl", "up", recipe, "--port", str(ports[recipe]), "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for recipe in MODELS
    }
    twin = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("twin_generate.py")), str(spec), str(twin_out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    servers: dict[str, Served] = {}
    try:
        for recipe, proc in ups.items():
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, f"sparkctl up {recipe} failed:\n{err[-6000:]}"
            servers[recipe] = Served(recipe, ports[recipe], json.loads(out), time.monotonic() - t0)
        log, _ = twin.communicate(timeout=900)
        assert twin.returncode == 0, f"twin generation failed:\n{log[-6000:]}"
        twin_wall = time.monotonic() - t0
        raw = json.loads(twin_out.read_text())
        twins = {recipe: raw[str(twin_dirs[recipe])] for recipe in MODELS}
        yield Session(env, servers, twins, twin_wall)
    finally:
        for proc in (*ups.values(), twin):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        _sparkctl(env, "down", "--all", timeout=180)


def _complete(served: Served, prompt: str) -> dict:
    r = httpx.post(
        f"{served.up['base_url']}/v1/completions",
        json={
            "model": served.up["model"],
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": LOGPROBS,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        },
        timeout=300,
    )
    r.raise_for_status()
    (choice,) = r.json()["choices"]
    top = [
        {k.removeprefix("token_id:"): v for k, v in step.items()}
        for step in choice["logprobs"]["top_logprobs"]
    ]
    return {"prompt_token_ids": choice["prompt_token_ids"], "token_ids": choice["token_ids"], "logprobs": top}


def _compare(recipe: str, ours: dict, twin: dict) -> str:
    """Assert the match rule of the module docstring for one prompt; return a one-line summary."""
    assert ours["prompt_token_ids"] == twin["prompt_token_ids"]
    q, t = ours["token_ids"], twin["token_ids"]
    assert len(q) == len(t) == MAX_TOKENS
    assert len(set(q)) >= 8, f"{recipe}: degenerate greedy output {q}"
    first = next((i for i, (a, b) in enumerate(zip(q, t, strict=True)) if a != b), None)
    upto = MAX_TOKENS if first is None else first
    worst = 0.0
    for step in range(upto):
        tok = str(q[step])
        diff = abs(ours["logprobs"][step][tok] - twin["logprobs"][step][tok])
        worst = max(worst, diff)
        assert diff <= LOGPROB_TOL, f"{recipe}: step {step} token {tok}: logprob differs by {diff:.2e}"
    if first is None:
        return f"identical for {MAX_TOKENS} tokens, max |dlogprob| {worst:.1e}"
    # diverged: both candidates must be in both top-k lists with logprobs within tolerance (a twin near-tie)
    a, b = str(q[first]), str(t[first])
    for tok in (a, b):
        assert tok in ours["logprobs"][first] and tok in twin["logprobs"][first], f"{recipe}: step {first}"
        diff = abs(ours["logprobs"][first][tok] - twin["logprobs"][first][tok])
        assert diff <= LOGPROB_TOL, (
            f"{recipe}: diverged at step {first}; token {tok} logprob differs by {diff:.2e}"
        )
    gap = twin["logprobs"][first][b] - twin["logprobs"][first][a]
    assert gap <= LOGPROB_TOL, f"{recipe}: diverged at step {first} without a near-tie (twin gap {gap:.2e})"
    return f"diverged at step {first} on a near-tie (gap {gap:.1e}), logprobs within {LOGPROB_TOL}"


@pytest.mark.parametrize("recipe", list(MODELS))
def test_up_serves_the_exl3_model(exl3_session: Session, recipe: str) -> None:
    served = exl3_session.servers[recipe]
    assert served.up["recipe"] == recipe and served.up["model"] == recipe
    assert served.up["smoke_tokens"] >= 1
    log = _sparkctl(exl3_session.env, "logs", recipe)
    assert log.returncode == 0, log.stderr
    assert "quantization=exl3" in log.stdout, "the server did not load the checkpoint with the exl3 method"
    print(f"\nup {recipe}: healthy after {served.up['seconds_to_healthy']:.1f}s")


@pytest.mark.parametrize("recipe", list(MODELS))
def test_greedy_completions_match_the_dequantized_twin(exl3_session: Session, recipe: str) -> None:
    served, twin = exl3_session.servers[recipe], exl3_session.twins[recipe]
    lines = []
    identical = 0
    for prompt, expected in zip(PROMPTS, twin["completions"], strict=True):
        summary = _compare(recipe, _complete(served, prompt), expected)
        identical += summary.startswith("identical")
        lines.append(f"  {prompt[:30]!r}: {summary}")
    print(f"\n{recipe} vs twin (twin engine start {twin['startup_s']:.0f}s):\n" + "\n".join(lines))
    assert identical >= len(PROMPTS) - 1, "more than one prompt diverged from the twin"


def test_server_refuses_a_checkpoint_without_exl3_tensors(tmp_path: Path) -> None:
    """The real server stops at startup with one clear line when config.json says exl3 but no tensor is EXL3.

    (An unknown codebook marker fails later, in the worker's load; its message comes from the same code the
    layer tests exercise, test_unknown_codebook_marker.)"""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this Python (make install-vllm)")
    from sparkctl.models import tiny_exl3
    from sparkctl.server.ports import free_port

    model = tmp_path / "not-exl3"
    tiny_exl3.make_tiny_dense_twin(model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "exl3"}
    (model / "config.json").write_text(json.dumps(cfg))
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--port", str(free_port()), "--dtype", "float32", "--enforce-eager", "--max-model-len", "256"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert res.returncode != 0
    assert (
        "config.json declares quant_method exl3 but no safetensors file holds an EXL3 tensor"
        in res.stderr + res.stdout
    )
