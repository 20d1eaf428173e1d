"""The engine check's own rules (kernels/bench/engine_check.py), on the fixtures' real configs: which dtype a job
runs at and why, which MoE decode path it must reach, and the verdict over a job's record."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_module import loaded

SCRIPT = Path(__file__).resolve().parents[2] / "kernels" / "bench" / "engine_check.py"


@pytest.fixture(scope="module")
def ec():
    yield from loaded(SCRIPT, "engine_check")


def test_glm4_moe_runs_at_fp32_everything_else_at_fp16(ec) -> None:
    """vLLM's fp16 GLM-4-MoE runs its shared experts at 1/routed_scaling_factor: those fixtures run at fp32 (bf16 adds
    rounding the bounds are not made for), every other at exllamav3's fp16."""
    dtypes = {name: ec.gpu_dtype(ec.fixture_config(name)) for name, _ in ec.fixtures(None)}
    glm = {n for n in dtypes if n.startswith("glm4moe")}
    assert glm == {"glm4moe-3.0-mul1", "glm4moe-mtp-3.0-mul1"}
    for name, (dtype, why) in dtypes.items():
        if name in glm:
            assert dtype == "float32" and "GLM-4-MoE" in why
        else:
            assert dtype == "float16", name
    assert ec.engine_kwargs("glm4moe-3.0-mul1", cpu=False)["dtype"] == "float32"
    assert ec.engine_kwargs("glm4moe-3.0-mul1", cpu=True)["dtype"] == "float32"


def test_a_glm_config_without_routed_scaling_stays_fp16(ec) -> None:
    config = dict(ec.fixture_config("glm4moe-3.0-mul1"), routed_scaling_factor=1.0)
    assert ec.gpu_dtype(config)[0] == "float16"


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("qwen3moe-2.5-mul1", "moe-fused"),
        ("qwen3moe-4.0-mcg", "moe-per-expert"),
        ("glm4moe-3.0-mul1", "moe-fused"),
    ],
)
def test_moe_decode_path_follows_the_codebook(ec, name: str, path: str) -> None:
    assert ec.moe_decode_path(ec.fixture_config(name)) == path


def _record(**paths: int) -> dict:
    good = {"top1": 1.0, "mean_dlogprob": 0.01}
    dec = {"worst_gap_nats": 0.0, "mean_dlogprob": 0.001}
    return {
        "prompts_batch1": good,
        "prompts_batch8": good,
        "decode_batch1": dec,
        "decode_batch8": dec,
        "paths": {"gemv": 10, **paths},
        "moe": True,
        "moe_decode": "moe-fused",
    }


def test_verdict_wants_the_expected_moe_decode_path(ec) -> None:
    assert ec.verdict(_record(**{"moe-fused": 3, "moe-prefill": 1})) == []
    bad = ec.verdict(_record(**{"moe-per-expert": 3, "moe-prefill": 1}))
    assert len(bad) == 1 and "expected moe-fused" in bad[0]
    mcg = dict(_record(**{"moe-per-expert": 3, "moe-prefill": 1}), moe_decode="moe-per-expert")
    assert ec.verdict(mcg) == []
    assert ec.verdict(_record(**{"moe-fused": 3}))  # no MoE prefill: fails
    wrong = _record(**{"moe-fused": 3, "moe-prefill": 1})
    wrong["prompts_batch1"] = {"top1": 0.612, "mean_dlogprob": 1.705}
    assert any("top1 0.612" in b for b in ec.verdict(wrong))
