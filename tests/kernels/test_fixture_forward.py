"""kernels/bench/fixture_forward.py on the CPU: the real exllamav3 fixtures' whole forward through the plugin's layer
functions meets exllamav3's logits (the bar plugin_gpu_check.py holds the CUDA path to on the device), its three ways
through the prompts agree, and a wrong shard order is caught.

Seconds, not minutes: one batched forward per fixture (140 rows), a dense one and both MoE routers."""

from __future__ import annotations

import json
from pathlib import Path

import exl3_real
import pytest
import torch

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def ff():
    return exl3_real.fixture_forward()


def _present(name: str) -> Path:
    if reason := exl3_real.missing_reason(name):
        pytest.skip(reason)
    return exl3_real.path(name)


@pytest.mark.parametrize("name", ["llama-2.0-3inst", "qwen3moe-2.5-mul1", "glm4moe-3.0-mul1"])
def test_fixture_forward_meets_exllamav3_logits(ff, name: str) -> None:
    """Dense (3INST), Qwen3-MoE (softmax router, q/k norms, mul1 K=2.5 experts), GLM-4-MoE (sigmoid router with
    correction bias and scaling, shared expert, dense first layer, attention bias, partial RoPE)."""
    (r,) = ff.check_fixture(_present(name), CPU, ("batched",))
    print(f"\n{ff.result_line(r)}")
    assert r["positions"] == 140 and set(r["linear_rows"]) == {140}  # one packed forward
    assert r["top1"] >= ff.TOP1_MIN, ff.result_line(r)
    assert r["mean_dlogprob"] <= ff.DLOGPROB_MAX, ff.result_line(r)
    if "moe" in name:
        assert r["moe_tokens"] == {140: 2 if name.startswith("qwen3") else 1}


def test_prefill_and_decode_equal_batched(ff) -> None:
    """The three ways through the prompts compute the same logits on the CPU (fp32 reference): the packed mask,
    the positions and the KV cache are right, so on CUDA any difference between them is the kernels'."""
    model = ff.FixtureModel(_present("llama-2.0-3inst") / "model", CPU)
    # two prompts of different lengths, cut short (the modes are compared with each other, not with exllamav3)
    saved = ff.reference_prompts(exl3_real.path("llama-2.0-3inst"))
    prompts = [saved[0][0][:9], saved[1][0][:5]]
    batched = model.run(prompts, "batched")
    for mode in ("prefill", "decode"):
        model.reset_counts()
        for a, b in zip(model.run(prompts, mode), batched, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        rows = set(model.call_shapes()["linear_rows"])
        assert rows == ({len(p) for p in prompts} if mode == "prefill" else {1, 2}), (mode, rows)


def test_swapped_gate_up_shards_fail_the_check(ff) -> None:
    """gate and up have the same shape, so only the logits can tell their order: one layer swapped must fail."""
    fixture = _present("llama-2.0-3inst")
    model = ff.FixtureModel(fixture / "model", CPU)
    model.blocks[1].mlp.gate_up.shards.reverse()
    reference = ff.reference_prompts(fixture)
    got = ff.compare(reference, model.run([ids for ids, _ in reference], "batched"))
    assert got["top1"] < ff.TOP1_MIN or got["mean_dlogprob"] > ff.DLOGPROB_MAX, got


def test_unknown_architecture_is_skipped_by_name(ff, tmp_path: Path) -> None:
    fixture = tmp_path / "mamba-2.0-mul1"
    (fixture / "model").mkdir(parents=True)
    (fixture / "meta.json").write_text("{}")
    (fixture / "exl3_reference.safetensors").write_bytes(b"")
    (fixture / "model" / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    results, skipped = ff.check_fixtures(tmp_path, CPU)
    assert results == []
    assert skipped == [
        {"fixture": "mamba-2.0-mul1", "reason": "architecture MambaForCausalLM not implemented here"}
    ]
