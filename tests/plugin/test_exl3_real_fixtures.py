"""Checkpoints made by exllamav3 1.6.5's own converter (tests/fixtures/exl3_real/) served by the real vLLM on
the CPU with our plugin, against exllamav3's own logits for the same prompts.

What must hold, per fixture, over every prompt position (position t predicts token t+1; the prompts are
fixed token ids, so no tokenizer stands between the two):
- the top-1 token agrees with exllamav3's argmax on at least TOP1_MIN of the positions;
- the prompt tokens' log-probabilities differ from exllamav3's by at most DLOGPROB_MAX on average.

Why not exact: exllamav3 runs fp16 activations through its own kernels, the plugin fp32 through our reference
decoder; both decode the same trellis, so they differ by rounding only (about 1e-3 in log-probability), while a
loading bug (wrong shard, K, codebook, expert or scale) moves log-probabilities by O(1).

Cost: one vLLM engine per fixture (20-45 s each on 2 cores), all in one child process for the session. By
default three run (3INST dense, a mul1 half rate in Qwen3-MoE, GLM-4-MoE with its shared expert) (DEFAULT); set
SPARKCTL_EXL3_REAL_ALL=1 for every fixture. The reference decoder itself is checked on all of them, without an
engine, by tests/kernels/test_exl3_real_decoder.py.

Glm5Next and Qwen4Exp do not run on vLLM 0.32's CPU build (CPU_CANNOT_RUN names what fails): their tests skip
with that reason where torch has no CUDA device, and are never handed to the engine child.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import exl3_real
import pytest
import torch

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

TOP1_MIN = 0.98
DLOGPROB_MAX = 0.05
DEFAULT = ("llama-2.0-3inst", "qwen3moe-2.5-mul1", "glm4moe-3.0-mul1")
CHILD = Path(__file__).with_name("exl3_real_logprobs.py")
_TORCHVISION = (
    "which imports torchvision (absent from the CPU venv; PyPI's torchvision fails against torch+cpu with "
    "'operator torchvision::nms does not exist')"
)
# source architecture -> why vLLM 0.32's CPU build cannot serve it (seen here, 2026-12-02; tests/fixtures/exl3_real/
# README.md): the first failure, then what stands behind it
CPU_CANNOT_RUN = {
    "glm5next": (
        "vLLM 0.32 CPU cannot run Glm5Next: vllm/models/glm5next/common/model.py imports "
        "vllm.model_executor.models.glm4_1v (its vision tower), which imports "
        f"transformers.models.glm4v.image_processing_glm4v, {_TORCHVISION}; past that, its DSA layers are sparse MLA "
        "(is_sparse when index_topk is set) and CpuPlatform.get_attn_backend_cls raises NotImplementedError('Sparse "
        "Attention is not supported on CPU.'), and its KDA layers run Triton GPU kernels (chunk_kda_with_fused_gate, "
        "fused_recurrent_kda)"
    ),
    "qwen4exp": (
        "vLLM 0.32 CPU cannot run Qwen4Exp: vllm/models/qwen4_exp/nvidia/model.py imports "
        "vllm.model_executor.models.qwen3_5, which imports qwen3_vl.py and transformers' qwen2_vl image processor, "
        f"{_TORCHVISION}"
    ),
}
SOURCE = {f.name: f.source for f in exl3_real.FIXTURES}


def _cpu_cannot_run(name: str) -> str | None:
    """The reason a fixture's architecture cannot run in this vLLM (CPU build only), else None."""
    reason = CPU_CANNOT_RUN.get(SOURCE[name])
    return reason if reason and not torch.cuda.is_available() else None


REPO = Path(__file__).resolve().parents[2]


def _selected() -> list[str]:
    return list(exl3_real.NAMES) if os.environ.get("SPARKCTL_EXL3_REAL_ALL") == "1" else list(DEFAULT)


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """vLLM's prompt log-probabilities for every selected fixture that exists, from one child process."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this Python (make install-vllm)")
    present = [n for n in _selected() if exl3_real.missing_reason(n) is None and _cpu_cannot_run(n) is None]
    if not present:
        return {}
    root = tmp_path_factory.mktemp("exl3-real")
    spec = {
        "models": {
            n: {
                "dir": str(exl3_real.path(n) / "model"),
                "prompts": [ids for ids, _ in exl3_real.prompts(exl3_real.reference(n))],
            }
            for n in present
        }
    }
    (root / "spec.json").write_text(json.dumps(spec))
    out = root / "out.json"
    res = subprocess.run(
        [sys.executable, str(CHILD), str(root / "spec.json"), str(out)],
        capture_output=True,
        text=True,
        timeout=300 + 120 * len(present),
        cwd=REPO,
    )
    assert res.returncode == 0 and out.exists(), f"vLLM child failed:\n{(res.stdout + res.stderr)[-6000:]}"
    return json.loads(out.read_text())


def _compare(name: str, ours: dict) -> tuple[float, float, int]:
    """(top-1 agreement, mean |delta log-prob|, positions) of vLLM + plugin against exllamav3's logits."""
    agree = positions = 0
    deltas: list[float] = []
    for (ids, logits), row in zip(exl3_real.prompts(exl3_real.reference(name)), ours["prompts"], strict=True):
        assert len(row["top1"]) == len(ids) and len(row["logprob"]) == len(ids) - 1, name
        theirs_top1 = logits.argmax(-1).tolist()
        agree += sum(a == b for a, b in zip(row["top1"], theirs_top1, strict=True))
        positions += len(ids)
        lp = torch.log_softmax(logits, -1)
        theirs_lp = lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        deltas += (theirs_lp - torch.tensor(row["logprob"])).abs().tolist()
    return agree / positions, sum(deltas) / len(deltas), positions


@pytest.mark.parametrize("name", exl3_real.NAMES)
def test_plugin_on_vllm_matches_exllamav3_logits(request: pytest.FixtureRequest, name: str) -> None:
    if reason := _cpu_cannot_run(name) or exl3_real.missing_reason(name):
        pytest.skip(reason)
    if name not in _selected():
        pytest.skip(f"{name}: not in the default set {DEFAULT} (SPARKCTL_EXL3_REAL_ALL=1 runs every fixture)")
    # the engines start only once a fixture that runs asks for them (a skip costs nothing)
    served: dict[str, dict] = request.getfixturevalue("served")
    ours = served[name]
    assert "error" not in ours, f"{name}: vLLM with the plugin failed: {ours.get('error')}"
    top1, dlp, n = _compare(name, ours)
    print(
        f"\n{name}: top-1 {top1:.1%} of {n} positions, mean |dlogprob| {dlp:.2e}, engine {ours['startup_s']:.0f}s"
    )
    assert top1 >= TOP1_MIN, f"{name}: top-1 agreement {top1:.1%} < {TOP1_MIN:.0%} ({n} positions)"
    assert dlp <= DLOGPROB_MAX, f"{name}: mean |delta log-prob| {dlp:.3f} > {DLOGPROB_MAX}"


def test_cpu_cannot_run_reasons_still_hold() -> None:
    """The skips above claim torchvision is missing from a CPU-only vLLM; where it imports, the claim is stale
    (run the two architectures and rewrite CPU_CANNOT_RUN and the fixtures README)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA torch: CPU_CANNOT_RUN does not apply")
    try:
        import torchvision  # noqa: F401, PLC0415
    except (
        Exception
    ) as exc:  # ModuleNotFoundError here; a broken install raises RuntimeError (torchvision::nms)
        print(f"\ntorchvision does not import here: {type(exc).__name__}: {exc}")
    else:
        pytest.fail(
            "torchvision imports in this CPU venv: CPU_CANNOT_RUN's first failure is gone, try both models"
        )
