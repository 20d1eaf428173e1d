"""The MTP fixture's source and the step that keeps its MTP layer beside the converter's EXL3 pack
(tests/fixtures/exl3_real/mtp_source.py), on the CPU without exllamav3 or vLLM: a mistake here would otherwise
show only after a device run, as a fixture vLLM cannot draft from."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import exl3_real
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, str(exl3_real.ROOT))
import mtp_source  # noqa: E402

MAKE = exl3_real._make_fixtures()


def _names(d: Path) -> set[str]:
    out: set[str] = set()
    for f in d.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            out |= set(st.keys())  # noqa: SIM118 (not a mapping)
    return out


def test_source_is_the_glm4moe_source_plus_one_mtp_layer(tmp_path: Path) -> None:
    src = MAKE.write_source("glm4moe_mtp", tmp_path / "mtp")
    base = MAKE.write_source("glm4moe", tmp_path / "base")
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["architectures"] == ["Glm4MoeForCausalLM"]
    t, b = load_file(str(src / "model.safetensors")), load_file(str(base / "model.safetensors"))
    assert all(torch.equal(t[k], v) for k, v in b.items()), "the target half differs from the glm4moe source"
    mtp = sorted(set(t) - set(b))
    p = mtp_source.mtp_prefix(cfg) + "."
    assert p == "model.layers.2." and all(k.startswith(p) for k in mtp)
    # what vLLM's Glm4MoeMTP loads: the MTP input, its MoE block (past first_k_dense_replace), the head's norm
    for leaf in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"):
        assert p + leaf in mtp
    assert t[p + "eh_proj.weight"].shape == (cfg["hidden_size"], 2 * cfg["hidden_size"])
    assert sum(".mlp.experts." in k for k in mtp) == 3 * cfg["n_routed_experts"]
    assert p + "mlp.gate.e_score_correction_bias" in mtp and p + "mlp.shared_experts.down_proj.weight" in mtp
    # the block is the target's last layer (so the draft agrees with the target at times: mtp_source)
    block = [k for k in mtp if k.removeprefix(p).split(".")[0] in ("self_attn", "mlp")]
    assert block and all(torch.equal(t[k], t[k.replace(p, "model.layers.1.")]) for k in block)
    assert [k for k in mtp if "self_attn" in k and k.endswith(".bias")] == [
        f"{p}self_attn.{n}_proj.bias" for n in "kqv"
    ]


def test_keep_mtp_copies_the_layer_beside_the_pack_once(tmp_path: Path) -> None:
    src = MAKE.write_source("glm4moe_mtp", tmp_path / "src")
    model = tmp_path / "model"
    shutil.copytree(exl3_real.path("glm4moe-3.0-mul1") / "model", model)
    with pytest.raises(RuntimeError, match="num_nextn_predict_layers"):
        mtp_source.keep_mtp(src, model)  # the converter's config without the MTP count: not an MTP model
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    before = _names(model)
    kept = mtp_source.keep_mtp(src, model)
    assert len(kept) == 42 and set(kept) == _names(model) - before
    src_t, kept_t = load_file(str(src / "model.safetensors")), load_file(str(model / mtp_source.MTP_FILE))
    assert all(torch.equal(kept_t[k], src_t[k]) and kept_t[k].dtype == src_t[k].dtype for k in kept)
    with pytest.raises(RuntimeError, match="already wrote"):
        mtp_source.keep_mtp(src, model)  # would shadow MTP tensors the output already has


def test_keep_mtp_adds_the_layer_to_a_sharded_outputs_index(tmp_path: Path) -> None:
    src = MAKE.write_source("glm4moe_mtp", tmp_path / "src")
    model = tmp_path / "model"
    shutil.copytree(exl3_real.path("glm4moe-3.0-mul1") / "model", model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    names = _names(model)
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "model.safetensors")}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    kept = mtp_source.keep_mtp(src, model)
    wm = json.loads((model / "model.safetensors.index.json").read_text())["weight_map"]
    assert {k: wm[k] for k in kept} == dict.fromkeys(kept, mtp_source.MTP_FILE) and len(wm) == len(names) + 42
