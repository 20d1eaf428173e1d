"""Fixtures for the vLLM exl3 plugin tests: tiny checkpoints on disk and a world-size-1 vLLM environment.

The layer tests build vLLM's real layer classes (QKVParallelLinear, RowParallelLinear, ParallelLMHead,
the fused-MoE runner) on the CPU. They need the process-wide state vLLM's model loader normally sets
up: a current VllmConfig and an initialised (gloo, world size 1) distributed group. That is done once
per session, as vLLM's own quantization tests do.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The four tiny models (sparkctl.models.tiny_exl3, written by sparkctl_exl3.checkpoint), once per session."""
    from sparkctl.models import tiny_exl3

    root = tmp_path_factory.mktemp("exl3-models")
    out = {}
    for name, fn in (
        ("dense", tiny_exl3.make_tiny_dense),
        ("dense-twin", tiny_exl3.make_tiny_dense_twin),
        ("moe", tiny_exl3.make_tiny_moe),
        ("moe-twin", tiny_exl3.make_tiny_moe_twin),
    ):
        fn(root / name)
        out[name] = root / name
    return out


def _have_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="session")
def vllm_env() -> Iterator[object]:
    """A current VllmConfig and a world-size-1 gloo process group, for building vLLM layers directly."""
    if not _have_vllm():
        pytest.skip("vLLM is not installed (make install-vllm)")
    from sparkctl_exl3.vllm_plugin import register
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )

    register()
    config = VllmConfig()
    with set_current_vllm_config(config), tempfile.TemporaryDirectory() as tmp:
        if not model_parallel_is_initialized():
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"file://{tmp}/dist-init",
                local_rank=0,
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
        yield config
