"""`sparkctl up` through the prepare stage with the real vLLM on the CPU: a tiny Llama stored in a Hugging
Face cache layout whose shipped index, like Qwen3.8-Flash-Next's, omits a tensor file. vLLM loads only
the files an index names, so the raw snapshot fails to load (missing weights); served from the overlay
with the regenerated index, it answers, and the cache is untouched."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packs import hf_cache, tree_state
from safetensors.torch import load_file, save_file

from sparkctl.models.tiny import make_tiny_llama
from sparkctl.server.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]


def _split_with_a_stale_index(model_dir: Path) -> None:
    tensors = load_file(str(model_dir / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(model_dir / file))
    (model_dir / "model.safetensors").unlink()
    stale = dict.fromkeys(halves["model-00001-of-00002.safetensors"], "model-00001-of-00002.safetensors")
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": stale}))


def test_up_serves_the_prepared_overlay(tmp_path: Path) -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this Python (make install-vllm)")
    make_tiny_llama(tmp_path / "src")
    _split_with_a_stale_index(tmp_path / "src")
    hub = tmp_path / "hf" / "hub"
    snapshot = hf_cache(tmp_path / "src", hub, "org/tiny-split", "main")
    recipe = tmp_path / "tiny-split.yaml"
    recipe.write_text(
        "schema: 1\nextends: tiny\n"
        "model: {generate: null, repo: org/tiny-split, revision: main, prepare: {index: true}}\n"
    )
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(hub),
        "HF_HUB_OFFLINE": "1",
        "SPARKCTL_CACHE_DIR": str(tmp_path / "cache"),
        "SPARKCTL_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")]),
    }
    before = tree_state(hub)

    def sparkctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sparkctl", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    try:
        up = sparkctl("up", str(recipe), "--offline", "--port", str(free_port()), "--json", timeout=600)
        assert up.returncode == 0, up.stderr
        result = json.loads(up.stdout)
        overlay = Path(result["model_path"])
        assert overlay.is_relative_to(tmp_path / "cache" / "packs")
        assert "prepare" in result["timings_s"] and result["smoke_tokens"] > 0
        assert "prepare" in up.stderr and "adds model-00002-of-00002.safetensors" in up.stderr
        index = json.loads((overlay / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == {
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        }
        log = Path(tmp_path / "state" / "logs" / "tiny-split.log").read_text()
        assert str(overlay) in log  # the engine was pointed at the overlay, not the snapshot
        assert str(snapshot) not in log
    finally:
        sparkctl("down", "--all")
    assert tree_state(hub) == before
