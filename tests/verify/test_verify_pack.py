"""`sparkctl.verify` on real packs: every exllamav3-made fixture and the tiny EXL3 models pass, and each planted
corruption fails with the module (or shard) it is in named. CPU only: the kernel layer runs the plugin's CPU path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import exl3_real
import pytest
import torch
from verify_packs import fixture_copy, flip_word, rewrite, set_storage, shard

from sparkctl.verify import records
from sparkctl.verify.records import FAIL, PASS, SKIP
from sparkctl.verify.run import failure_line, verify

MCG = "llama-3.0-mcg"  # every module mcg: a marker to swap
MOE = "qwen3moe-2.5-mul1"


def _row(record, what: str):  # noqa: ANN001, ANN202
    return next(c for c in record.checks if c.what == what)


def _failed(record) -> str:  # noqa: ANN001
    """Every failure, one per line: what the assertions search for the module's name."""
    return "\n".join(f"{c.what}: {f.module}: {f.reason}" for c, f in record.failures())


@pytest.mark.parametrize("name", exl3_real.NAMES)
def test_every_exllamav3_fixture_passes(name: str) -> None:
    reason = exl3_real.missing_reason(name)
    if reason:
        pytest.skip(reason)
    model = exl3_real.path(name) / "model"
    rec = verify(model, name=name)
    assert rec.ok, _failed(rec)
    modules = _row(rec, "EXL3 modules: shape, K, codebook")
    assert modules.checked == len(exl3_real.meta(name)["exl3_modules"])
    kernels = [c for c in rec.checks if c.layer == "kernels" and c.verdict == PASS]
    assert {c.what for c in kernels} >= {"attention", "lm_head"}
    assert all(c.worst is not None and c.worst < 1e-5 for c in kernels if c.unit == "rel L2")
    assert "cpu" in rec.device


def test_every_kind_and_k_is_sampled(tmp_path: Path) -> None:
    """GLM-4-MoE with its MTP layer: attention, dense MLP, routed experts, shared expert, MTP, lm_head all checked."""
    rec = verify(exl3_real.path("glm4moe-mtp-3.0-mul1") / "model", name="g")
    kinds = {c.what for c in rec.checks if c.layer == "kernels" and c.verdict == PASS}
    assert {
        "attention",
        "dense MLP",
        "routed experts K=3",
        "shared expert",
        "lm_head",
        "MoE forward (routed)",
    } <= kinds
    q = verify(exl3_real.path("qwen4exp-3.0-mul1") / "model", name="q")
    ngram = _row(q, "n-gram rows")
    assert ngram.verdict == PASS and ngram.checked > 0 and ngram.worst == 0.0
    assert _row(q, "MTP layer").verdict == PASS


def test_tiny_exl3_packs_pass(tmp_path: Path) -> None:
    from sparkctl.models import tiny_exl3

    tiny_exl3.make_tiny_moe(tmp_path / "moe")
    rec = verify(tmp_path / "moe", name="tiny-exl3-moe")
    assert rec.ok, _failed(rec)
    # every K the plan mixes into the experts is its own row
    ks = {c.what for c in rec.checks if c.what.startswith("routed experts")}
    assert len(ks) >= 4
    assert _row(rec, "MoE forward (routed)").verdict == PASS


# -- planted corruptions -----------------------------------------------------------------------------


def test_flipped_trellis_word_is_named_by_the_digest_of_the_last_verification(tmp_path: Path) -> None:
    model = fixture_copy(MCG, tmp_path)
    first = verify(model, name="p", full=True)
    assert first.ok
    records.save(first)
    module = "model.layers.1.mlp.down_proj"
    flip_word(model, f"{module}.trellis", 37)
    again = verify(model, name="p", full=True)
    assert not again.ok
    assert _row(again, "unchanged since last verify").verdict == FAIL
    assert f"{module}: {module}.trellis changed on disk" in _failed(again)
    assert failure_line(again).startswith(f"verify p: unchanged since last verify: {module}")
    # the changed tensor does not become the baseline: a third run still fails
    records.save(again)
    assert not verify(model, name="p", full=True).ok


def test_flipped_trellis_word_fails_the_hub_checksum(tmp_path: Path) -> None:
    """In a Hugging Face cache the snapshot's file links to blobs/<sha256>: --full hashes it."""
    src = fixture_copy(MCG, tmp_path / "src")
    repo = tmp_path / "hub" / "models--o--m"
    snap = repo / "snapshots" / ("0" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in src.iterdir():
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    ok = verify(snap, name="hub", full=True)
    assert _row(ok, "checksums vs hub").verdict == PASS and _row(ok, "checksums vs hub").checked == 1
    assert _row(verify(snap, name="hub"), "checksums vs hub").verdict == SKIP  # --quick does not hash
    flip_word(snap, "model.layers.0.self_attn.q_proj.trellis", 3)
    bad = verify(snap, name="hub", full=True)
    assert _row(bad, "checksums vs hub").verdict == FAIL
    assert "checksums vs hub: model.safetensors: sha256" in _failed(bad)


def test_swapped_codebook_marker_is_named(tmp_path: Path) -> None:
    model = fixture_copy(MCG, tmp_path)
    module = "model.layers.0.self_attn.k_proj"

    def swap(t: dict) -> None:
        del t[f"{module}.mcg"]
        t[f"{module}.mul1"] = torch.tensor(0x83DCD12D - (1 << 32), dtype=torch.int32)

    rewrite(model, swap)
    rec = verify(model, name="m")
    assert not rec.ok
    assert f"{module}: marker says codebook mul1 but quantization_config.json says mcg" in _failed(rec)
    assert failure_line(rec).startswith(f"verify m: EXL3 modules: shape, K, codebook: {module}:")


def test_marker_with_the_other_codebooks_constant_is_named(tmp_path: Path) -> None:
    model = fixture_copy(MCG, tmp_path)
    module = "model.layers.1.self_attn.o_proj"
    rewrite(
        model,
        lambda t: t.__setitem__(f"{module}.mcg", torch.tensor(0x83DCD12D - (1 << 32), dtype=torch.int32)),
    )
    rec = verify(model, name="m")
    assert f"{module}: mcg marker holds 0x83dcd12d, the mul1 constant" in _failed(rec)


def test_missing_shard_is_named_with_its_modules(tmp_path: Path) -> None:
    model = fixture_copy(MOE, tmp_path)
    weight_map = shard(model)
    assert verify(model, name="s").ok
    (model / "model-00002-of-00002.safetensors").unlink()
    rec = verify(model, name="s")
    assert not rec.ok
    text = _failed(rec)
    assert "shard model-00002-of-00002.safetensors named by the index is missing" in text
    lost = sorted({t.rpartition(".")[0] for t, f in weight_map.items() if f.startswith("model-00002")})
    assert lost[0] in text  # the first module the lost shard held is named


def test_stray_shard_is_named(tmp_path: Path) -> None:
    model = fixture_copy(MOE, tmp_path)
    shard(model)
    shutil.copy(model / "model-00001-of-00002.safetensors", model / "model-00003-of-00002.safetensors")
    rec = verify(model, name="s")
    text = _failed(rec)
    assert "stray shard model-00003-of-00002.safetensors" in text
    assert "is stored twice" in text


def test_wrong_k_in_the_config_is_named(tmp_path: Path) -> None:
    model = fixture_copy(MOE, tmp_path)
    module = "model.layers.1.mlp.experts.5.up_proj"
    set_storage(model, module, bits_per_weight=3)
    rec = verify(model, name="k")
    assert not rec.ok
    assert f"{module}: trellis holds K=2.5 but quantization_config.json says bits_per_weight 3" in _failed(
        rec
    )


def test_truncated_shard_is_named(tmp_path: Path) -> None:
    model = fixture_copy(MCG, tmp_path)
    f = model / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    rec = verify(model, name="t")
    assert "shard model.safetensors unreadable" in _failed(rec)


def test_bad_ngram_layout_is_named(tmp_path: Path) -> None:
    model = fixture_copy("qwen4exp-3.0-mul1", tmp_path)
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = model / "ngram_embedding.safetensors"
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
    t = load_file(str(path))
    key = next(k for k in t if k.endswith(".head_offsets"))
    t[key] = t[key].flip(0).contiguous()  # descending: rows would be given to the wrong hash heads
    save_file(t, str(path), metadata=meta)
    rec = verify(model, name="n")
    assert f"{key.rpartition('.')[0]}: head_offsets" in _failed(rec)


# -- --quick reads a sample ----------------------------------------------------------------------------


def test_quick_reads_only_the_sampled_modules(tmp_path: Path) -> None:
    """Bytes read are counted exactly: --quick reads the headers, the markers and the sampled modules (plus one MoE
    layer's experts), --full every tensor of every EXL3 module."""
    from sparkctl.models import tiny_exl3
    from sparkctl.verify import kernels, pack

    tiny_exl3.make_tiny_moe(tmp_path / "moe")
    quick = verify(tmp_path / "moe", name="q")
    full = verify(tmp_path / "moe", name="f", full=True)
    p = pack.open_pack(tmp_path / "moe")
    _, facts, _ = pack.run(p, full=False)
    linears = [m for ms in kernels.sample(p, facts, full=False).values() for m in ms]
    moe = kernels.moe_layers(p, facts)
    first = sorted(moe)[0]  # layer 0: the one MoE layer --quick runs
    experts = [m for e in moe[first].values() for m in e.values()]

    def size(m: str) -> int:
        return sum(p.reader.where[n].nbytes for n in p.modules[m].values())

    markers = sum(
        p.reader.where[n].nbytes for m in facts for leaf, n in p.modules[m].items() if leaf in ("mcg", "mul1")
    )
    router = p.reader.where[f"{first.rpartition('.')[0]}.gate.weight"].nbytes
    header = sum(s.header_bytes for s in p.reader.shards.values())
    # every read counted, a module read twice (as a sampled linear and in the MoE layer) twice
    assert quick.bytes_read == header + markers + sum(map(size, linears)) + sum(map(size, experts)) + router
    exl3_bytes = sum(p.reader.where[n].nbytes for m in facts for n in p.modules[m].values())
    assert full.bytes_read >= exl3_bytes and quick.bytes_read < full.bytes_read
    assert quick.seconds > 0 and quick.mode == "quick" and full.mode == "full"


def test_record_round_trips_and_feeds_bench(tmp_path: Path) -> None:
    rec = verify(exl3_real.path(MCG) / "model", name="tiny-x")
    path = records.save(rec)
    assert json.loads(path.read_text())["ok"] is True
    back = records.latest("tiny-x")
    assert back is not None and back.ok and back.checks[0].what == rec.checks[0].what
    summary = records.bench_summary("tiny-x")
    assert summary is not None and summary["ok"] and summary["mode"] == "quick"
    assert records.bench_summary("never-verified") is None


def test_non_finite_scale_fails_the_kernel_row_naming_the_module(tmp_path: Path) -> None:
    """A scale overwritten with inf keeps every shape and dtype (the pack layer passes) but poisons the product."""
    model = fixture_copy(MOE, tmp_path)
    q = "model.layers.0.self_attn.k_proj"  # the first attention module in the file: always sampled
    expert = "model.layers.0.mlp.experts.3.down_proj"  # in the MoE layer --quick runs

    def poison(t: dict) -> None:
        t[f"{q}.suh"][5] = float("inf")
        t[f"{expert}.svh"][7] = float("nan")

    rewrite(model, poison)
    rec = verify(model, name="x")
    assert _row(rec, "EXL3 modules: shape, K, codebook").verdict == PASS
    assert _row(rec, "attention").verdict == FAIL
    text = _failed(rec)
    assert f"attention: {q}: rel L2 at 1 rows inf > bound" in text
    moe = _row(rec, "MoE forward (routed)")
    assert moe.verdict == FAIL and moe.failures[0].module == "model.layers.0.mlp.experts"


def test_engine_row_fails_naming_a_server_that_does_not_answer(tmp_path: Path) -> None:
    from sparkctl.server.ports import free_port
    from sparkctl.verify import engine

    model = exl3_real.path("llama-2.0-3inst") / "model"
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = json.loads((model / "config.json").read_text())
    lp, greedy = engine.run(model, config, 0, engine.EngineTarget(url, "m"), "cpu", timeout_s=5)
    assert lp.verdict == greedy.verdict == FAIL
    assert lp.failures[0].module == url and "did not answer" in lp.failures[0].reason
    # no server at all: skipped, saying how to get one
    skipped, _ = engine.run(model, config, 0, None, "cpu")
    assert skipped.verdict == SKIP and "--verify" in skipped.note
