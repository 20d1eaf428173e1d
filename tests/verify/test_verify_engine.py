"""The engine layer against a real server: `sparkctl up tiny-exl3-moe --verify` (the real vLLM on the CPU with the
plugin) passes with the engine checked, and the same server checked against a pack whose lm_head differs from the
one it serves fails, naming the engine row: the check can tell a server computing other numbers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sparkctl_proc import REPO, run_in_env

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict, dict, subprocess.CompletedProcess]]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this Python (make install-vllm)")
    from sparkctl.server.ports import free_port

    root = tmp_path_factory.mktemp("verify-engine")
    env = {**os.environ, "SPARKCTL_STATE_DIR": str(root / "state"), "SPARKCTL_CACHE_DIR": str(root / "cache")}
    port = str(free_port())
    try:
        up = subprocess.run(
            [sys.executable, "-m", "sparkctl", "up", "tiny-exl3-moe", "--port", port, "--verify", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=REPO,
        )
        yield env, json.loads(up.stdout) if up.stdout.strip() else {}, up
    finally:
        run_in_env(env, "down", "--all", timeout=180)


def test_up_verify_checks_the_engine(served: tuple[dict, dict, subprocess.CompletedProcess]) -> None:
    env, up, proc = served
    assert proc.returncode == 0, proc.stderr[-4000:]
    v = up["verification"]
    assert v["ok"] is True and v["layers"] == ["engine", "kernels", "pack"]
    kept = json.loads((Path(env["SPARKCTL_STATE_DIR"]) / "verify" / "tiny-exl3-moe.json").read_text())
    rows = {c["what"]: c for c in kept["checks"] if c["layer"] == "engine"}
    lp = rows["prompt log-probs vs reference"]
    assert lp["verdict"] == "pass" and lp["checked"] == 3 and lp["worst"] < 1e-3
    assert "top-1 agreement 1.000" in lp["note"]
    assert rows["greedy continuation"]["verdict"] == "pass" and rows["greedy continuation"]["checked"] == 24


def test_engine_check_fails_on_other_numbers(
    served: tuple[dict, dict, subprocess.CompletedProcess], tmp_path: Path
) -> None:
    """The server serves the pristine pack; the reference is built from a copy whose lm_head trellis is reversed."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from sparkctl.verify import engine

    env, up, proc = served
    assert proc.returncode == 0, proc.stderr[-4000:]
    copy = tmp_path / "other"
    shutil.copytree(up["model_path"], copy)
    tensors = load_file(str(copy / "model.safetensors"))
    tensors["lm_head.trellis"] = torch.flip(tensors["lm_head.trellis"], dims=[0]).contiguous()
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((copy / "config.json").read_text())
    target = engine.EngineTarget(up["base_url"], up["model"])
    lp, greedy = engine.run(copy, config, 0, target, "cpu")
    assert lp.verdict == "fail"
    assert any(f.module == "whole model" for f in lp.failures)
    assert lp.worst is not None and lp.worst > engine.DLOGPROB_MAX
    assert greedy.verdict == "fail"
