"""A tiny Qwen4Exp-shaped pack stored in a real Hugging Face cache layout, and a recipe that prepares it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from packs import PackCache, hf_cache, write_qwen4exp_pack

REPO = "turboderp/Tiny-Qwen4Exp-exl3"
REVISION = "3.05bpw_h5_ng5"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pack_cache(tmp_path_factory: pytest.TempPathFactory) -> PackCache:
    root = tmp_path_factory.mktemp("packs")
    table = write_qwen4exp_pack(root / "src")
    hub = root / "hf" / "hub"
    snapshot = hf_cache(root / "src", hub, REPO, REVISION)
    recipe = root / "tiny-qwen4exp-pack.yaml"
    recipe.write_text(
        "schema: 1\n"
        "runtime: native\n"
        f"model: {{repo: {REPO}, revision: {REVISION}, format: exl3, prepare: {{index: true, config: true}}}}\n"
        "engine: {name: vllm, device: cpu}\n"
        "serve: {max_model_len: 256}\n"
    )
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(hub),
        "HF_HUB_OFFLINE": "1",
        "SPARKCTL_CACHE_DIR": str(root / "sparkctl-cache"),
        "SPARKCTL_STATE_DIR": str(root / "sparkctl-state"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("SPARKCTL_RECIPES_DIR", None)
    return PackCache(hub=hub, snapshot=snapshot, table=table, recipe=recipe, env=env)
