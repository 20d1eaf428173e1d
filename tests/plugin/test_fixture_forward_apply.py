"""kernels/bench/fixture_forward.py's merged linear is vLLM's: its copy of ``EXL3LinearMethod.apply`` (the device
has no vLLM to import it from) gives the plugin's own ``apply`` result bit for bit, on a real fixture's fused
q/k/v with bias and gate/up, so the GPU check's model runs the linears exactly as the plugin does."""

from __future__ import annotations

import exl3_real
import pytest
import torch

pytestmark = pytest.mark.vllm

FIXTURE = "glm4moe-3.0-mul1"  # attention bias: the bias is added after the shards are merged


def _holder(lin) -> torch.nn.Module:
    """A layer in the state ``EXL3LinearMethod.process_weights_after_loading`` leaves it in."""
    layer = torch.nn.Module()
    for i, w in enumerate(lin.shards):
        layer.register_buffer(f"exl3_trellis_{i}", w.trellis, persistent=False)
        layer.register_buffer(f"exl3_suh_{i}", w.suh, persistent=False)
        layer.register_buffer(f"exl3_svh_{i}", w.svh, persistent=False)
    layer.exl3_codebooks = [w.codebook for w in lin.shards]
    layer.exl3_bits = [w.bits for w in lin.shards]
    layer.exl3_out = list(lin.out_sizes)
    return layer


def test_merged_linear_equals_the_plugins_apply(vllm_env: object) -> None:
    if reason := exl3_real.missing_reason(FIXTURE):
        pytest.skip(reason)
    from sparkctl_exl3.vllm_plugin.linear import EXL3LinearMethod

    ff = exl3_real.fixture_forward()
    block = ff.FixtureModel(exl3_real.path(FIXTURE) / "model", torch.device("cpu")).blocks[0]
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0))
    for lin in (block.qkv, block.mlp.gate_up):
        assert len(lin.shards) == (3 if lin is block.qkv else 2)
        theirs = EXL3LinearMethod(None, lin.name).apply(_holder(lin), x, lin.bias)
        assert torch.equal(lin(x), theirs), lin.name
    assert block.qkv.bias is not None and block.mlp.gate_up.bias is None
