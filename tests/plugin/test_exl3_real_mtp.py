"""`sparkctl up` serves an exllamav3-made GLM-4-MoE checkpoint with MTP speculative decoding (k=2) through the
real vLLM on the CPU with our plugin; the bench's /metrics reader sees the drafts, and the prompt logprobs
still match exllamav3's logits.

The model (one server, started once for the module):
- ``glm4moe-mtp-3.0-mul1``: make_fixtures' MTP fixture (source ``mtp_source.write_mtp_source``), when it has
  been made on a GPU and committed; else skipped, naming the command.
- ``glm4moe-3.0-mul1+mtp``: the committed ``glm4moe-3.0-mul1`` fixture with the same MTP layer added beside the
  EXL3 pack as bf16 (``mtp_source.keep_mtp``) and ``num_nextn_predict_layers: 1``. This is what the converter
  itself produces from the MTP source (exllamav3 1.6.5 drops GLM-4-MoE's MTP layer: mtp_source's docstring), so
  it runs now, before the GPU-made fixture exists. exllamav3's reference logits are the target's, unchanged.

What must hold:
- prompt positions: top-1 agrees with exllamav3's argmax on >= TOP1_MIN, mean |dlogprob| <= DLOGPROB_MAX (the
  acceptance line of the real-fixture test; the MTP draft must not change the target's prompt scoring);
- the counters the bench reads (``sparkctl.bench.server_metrics``: vllm:spec_decode_num_drafts /
  num_draft_tokens / num_accepted_tokens) moved over the requests: drafts made, K draft tokens each, some
  accepted (the MTP block is the target's last layer on the next token's embedding: 3-10 % of draft tokens),
  an acceptance rate in [0, 1] (printed);
- speculative decoding is lossless under greedy: every generated token is the target's own argmax given the
  tokens before it (scored again as a prompt), or a near-tie within TIE_TOL.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import exl3_real
import httpx
import pytest
import torch
from sparkctl_proc import run_in_env

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
REAL = "glm4moe-mtp-3.0-mul1"
BASE = "glm4moe-3.0-mul1"
DERIVED = f"{BASE}+mtp"
K = 2
TOP1_MIN = 0.98
DLOGPROB_MAX = 0.05
GEN_TOKENS = 16
TIE_TOL = 1e-3


@dataclass
class Served:
    name: str
    reference: str  # the exllamav3-made fixture whose logits are the target's
    base_url: str
    model: str
    up: dict
    env: dict[str, str]


def _derive(root: Path) -> Path:
    """glm4moe-3.0-mul1's converter output plus the bf16 MTP layer, as the converter would leave it."""
    sys.path.insert(0, str(exl3_real.ROOT))
    import mtp_source

    model = root / "model"
    shutil.copytree(exl3_real.path(BASE) / "model", model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (model / "config.json").write_text(json.dumps(cfg, indent=4) + "\n")
    mtp_source.write_mtp_source(root / "src")
    mtp_source.keep_mtp(root / "src", model)
    return model


def _recipe(root: Path, model: Path, name: str) -> Path:
    """A recipe file on top of the built-in `tiny` (CPU, fp32, eager) serving `model` with MTP k=K."""
    r = root / f"{name}.yaml"
    r.write_text(
        "schema: 1\nextends: tiny\n"
        f"description: {name} with MTP speculative decoding through the exl3 plugin on the CPU\n"
        f"model:\n  generate: null\n  path: {model}\n  format: exl3\n"
        "  kv: {layers: 2, kv_heads: 2, head_dim: 64}\n"
        f"serve:\n  served_model_name: {name}\n"
        f"  speculative: {{method: mtp, num_speculative_tokens: {K}}}\n"
    )
    return r


@pytest.fixture(scope="module", params=[REAL, DERIVED])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Served:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this Python (make install-vllm)")
    name: str = request.param
    reference = REAL if name == REAL else BASE
    if reason := exl3_real.missing_reason(reference):
        pytest.skip(reason)
    from sparkctl.server.ports import free_port

    root = tmp_path_factory.mktemp("exl3-mtp")
    model = exl3_real.path(REAL) / "model" if name == REAL else _derive(root)
    served_name = name.replace("+", "-")
    env = {
        **os.environ,
        "SPARKCTL_STATE_DIR": str(root / "state"),
        "SPARKCTL_CACHE_DIR": str(root / "cache"),
    }
    port = free_port()
    argv = [sys.executable, "-m", "sparkctl", "up", str(_recipe(root, model, served_name))]
    proc = subprocess.run(
        [*argv, "--port", str(port), "--json"], env=env, capture_output=True, text=True, timeout=900, cwd=REPO
    )
    try:
        assert proc.returncode == 0, f"sparkctl up {name} failed:\n{proc.stderr[-6000:]}"
        up = json.loads(proc.stdout)
        yield Served(name, reference, up["base_url"].removesuffix("/v1"), up["model"], up, env)
    finally:
        run_in_env(env, "down", "--all", timeout=180)


def _complete(s: Served, ids: list[int], max_tokens: int) -> dict:
    """Greedy completion of token ids with prompt logprobs (top-1 and the prompt's own token at each position)."""
    r = httpx.post(
        f"{s.base_url}/v1/completions",
        json={
            "model": s.model,
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": 1,
            "prompt_logprobs": 1,
            "return_token_ids": True,
        },
        timeout=300,
    )
    r.raise_for_status()
    (choice,) = r.json()["choices"]
    return choice


def _position(step: dict) -> dict[int, tuple[float, int]]:
    """One prompt_logprobs entry as {token id: (logprob, rank)}."""
    return {int(k): (v["logprob"], v["rank"]) for k, v in step.items()}


def _top1(step: dict[int, tuple[float, int]]) -> int:
    return next(t for t, (_, rank) in step.items() if rank == 1)


@pytest.fixture(scope="module")
def run(served: Served) -> dict:
    """Every reference prompt through the server, with /metrics read by the bench's reader around it."""
    from sparkctl.bench import server_metrics

    http = httpx.Client(base_url=served.base_url)
    before = server_metrics.scrape(http)
    rows = []
    t0 = time.monotonic()
    for ids, logits in exl3_real.prompts(exl3_real.reference(served.reference)):
        rows.append((ids, logits, _complete(served, ids, GEN_TOKENS)))
    after = server_metrics.scrape(http)
    return {"rows": rows, "metrics": server_metrics.delta(before, after), "seconds": time.monotonic() - t0}


def test_up_serves_it_with_mtp(served: Served) -> None:
    log = run_in_env(served.env, "logs", served.model)
    assert log.returncode == 0, log.stderr
    assert "quantization=exl3" in log.stdout, "the server did not load the checkpoint with the exl3 method"
    assert "method='mtp'" in log.stdout and f"num_spec_tokens={K}" in log.stdout, "no MTP speculative config"
    assert "Loading drafter model" in log.stdout, "vLLM did not load the MTP draft"


def test_prompt_logprobs_match_exllamav3(served: Served, run: dict) -> None:
    agree = positions = 0
    deltas: list[float] = []
    for ids, logits, choice in run["rows"]:
        plp = choice["prompt_logprobs"]  # [None, {tok: {logprob, rank}}, ...]: entry t scores ids[t]
        steps = [_position(plp[t]) for t in range(1, len(ids))]
        first = choice["logprobs"]["top_logprobs"][
            0
        ]  # the last position's top-1 is the first generated token
        ours_top1 = [_top1(s) for s in steps] + [choice["token_ids"][0]]
        assert len(first) >= 1
        agree += sum(a == b for a, b in zip(ours_top1, logits.argmax(-1).tolist(), strict=True))
        positions += len(ids)
        lp = torch.log_softmax(logits, -1)
        theirs = lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        ours = torch.tensor([s[ids[t + 1]][0] for t, s in enumerate(steps)])
        deltas += (theirs - ours).abs().tolist()
    top1, dlp = agree / positions, sum(deltas) / len(deltas)
    print(
        f"\n{served.name} (MTP k={K}): top-1 {top1:.1%} of {positions} positions, mean |dlogprob| {dlp:.2e}"
    )
    assert top1 >= TOP1_MIN, f"{served.name}: top-1 agreement {top1:.1%} < {TOP1_MIN:.0%}"
    assert dlp <= DLOGPROB_MAX, f"{served.name}: mean |delta log-prob| {dlp:.3f} > {DLOGPROB_MAX}"


def test_bench_reader_sees_the_drafts(served: Served, run: dict) -> None:
    d = run["metrics"]
    assert d is not None, "the server has no /metrics"
    generated = sum(len(c["token_ids"]) for _, _, c in run["rows"])
    assert d.get("generation_tokens") == generated, d
    drafts = d.get("spec_drafts", 0.0)
    assert drafts > 0, f"no speculative drafts counted over {generated} generated tokens: {d}"
    assert d["spec_draft_tokens"] == K * drafts, d
    # each draft round verifies K tokens and yields 1 + accepted; no request yields more than it asked for
    assert 0.0 <= d["spec_acceptance_rate"] <= 1.0, d
    # the MTP block is the target's last layer on the next token's embedding (mtp_source): some drafts hold
    assert d["spec_accepted_tokens"] > 0, f"no draft token accepted: {d}"
    assert d["spec_acceptance_length"] == pytest.approx(1.0 + d["spec_accepted_tokens"] / drafts)
    assert drafts + d["spec_accepted_tokens"] <= generated, d
    print(
        f"\n{served.name}: {drafts:.0f} drafts x {K}, {d['spec_accepted_tokens']:.0f} accepted: rate "
        f"{d['spec_acceptance_rate']:.1%}, acceptance length {d['spec_acceptance_length']:.2f} "
        f"({generated} tokens in {run['seconds']:.1f}s)"
    )


def test_greedy_with_mtp_is_the_targets_greedy(served: Served, run: dict) -> None:
    """Each generated token, scored again as part of a prompt, is the target's top-1 there (or a near-tie)."""
    for ids, _, choice in run["rows"]:
        gen = choice["token_ids"]
        assert len(gen) == GEN_TOKENS
        again = _complete(served, ids + gen, 1)["prompt_logprobs"]
        for j, tok in enumerate(gen):
            step = _position(again[len(ids) + j])
            best = _top1(step)
            gap = step[best][0] - step[tok][0]
            assert best == tok or gap <= TIE_TOL, (
                f"{served.name}: generated token {j} ({tok}) is not the target's argmax {best} (gap {gap:.2e})"
            )


def test_sparkctl_bench_records_the_acceptance(served: Served, tmp_path: Path) -> None:
    """`sparkctl bench` itself, against the running server: its record carries the draft counters and rate."""
    out = tmp_path / "bench"
    res = run_in_env(
        served.env,
        *("bench", "--url", f"{served.base_url}/v1", "--model", served.model, "--api", "completions"),
        *(
            "-w",
            "suite",
            "--categories",
            "coding,prose",
            "--runs",
            "1",
            "--warmup",
            "1",
            "--max-tokens",
            "16",
        ),
        *("--out", str(out), "--no-html"),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    rec = json.loads((out / "bench.json").read_text())
    suite = rec["variants"][0]["workloads"]["suite"]
    sm = suite["server_metrics"]
    assert sm["spec_drafts"] > 0 and sm["spec_draft_tokens"] == K * sm["spec_drafts"], sm
    assert sm["spec_accepted_tokens"] > 0, sm
    assert 0.0 <= sm["spec_acceptance_rate"] <= 1.0 and sm["spec_acceptance_length"] >= 1.0, sm
    print(
        f"\nsparkctl bench on {served.name}: acceptance rate {sm['spec_acceptance_rate']:.1%}, length "
        f"{sm['spec_acceptance_length']:.2f} over {sm['spec_drafts']:.0f} drafts"
    )
