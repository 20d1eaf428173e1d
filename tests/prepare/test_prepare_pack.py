"""The prepare stage on a real Hugging Face cache layout: the overlay holds what vLLM needs, the cache is
never written, a second run writes nothing, and deleting the overlay undoes it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from packs import NGRAM_BITS, NGRAM_HEADS, NGRAM_PREFIX, NGRAM_ROWS_PER_HEAD, PackCache, tree_state
from sparkctl_exl3 import ngram

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow

ALL_FILES = {
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "ngram_embedding.safetensors",
    "mtp_hyper_connection_mixer_patch.safetensors",
}


def _prepare_json(pack: PackCache, *args: str) -> dict:
    r = pack.sparkctl("prepare", str(pack.recipe), "--offline", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_overlay_lists_every_tensor_file_and_never_writes_the_cache(pack_cache: PackCache) -> None:
    before = tree_state(pack_cache.hub)
    dry = _prepare_json(pack_cache, "--dry-run")
    overlay = Path(dry["overlay"])
    assert not overlay.exists()  # a dry run writes nothing anywhere
    (index_step,) = [s for s in dry["steps"] if s.startswith("model.safetensors.index.json")]
    assert "adds mtp_hyper_connection_mixer_patch.safetensors, ngram_embedding.safetensors" in index_step

    made = _prepare_json(pack_cache)
    assert made["reused"] is False and Path(made["overlay"]) == overlay
    assert tree_state(pack_cache.hub) == before

    index = json.loads((overlay / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == ALL_FILES
    assert index["weight_map"][f"{NGRAM_PREFIX}.shard_0.trellis"] == "ngram_embedding.safetensors"
    assert index["weight_map"]["mtp.layers.0.hyper_connection_mixer.weight"] == (
        "mtp_hyper_connection_mixer_patch.safetensors"
    )
    sizes = sum(os.path.getsize(overlay / f) for f in ALL_FILES)
    assert 0 < index["metadata"]["total_size"] < sizes  # tensor bytes: the files less their headers

    config = json.loads((overlay / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "exl3" and qc["codebook"] == "mul1"
    assert qc["ngram_embedding"]["module"] == NGRAM_PREFIX
    assert qc["ngram_embedding"]["bits"] == NGRAM_BITS
    assert qc["ngram_embedding"]["rows"] == NGRAM_HEADS * NGRAM_ROWS_PER_HEAD
    assert qc["ngram_embedding"]["num_heads"] == NGRAM_HEADS

    # everything else is a link into the cache's blobs: no copy of the weights
    blobs = (pack_cache.snapshot.parent.parent / "blobs").resolve()
    for name in [*ALL_FILES, "tokenizer_config.json"]:
        entry = overlay / name
        assert entry.is_symlink() and Path(os.readlink(entry)).parent == blobs, name
    assert not (overlay / "config.json").is_symlink()

    # the table loads from the overlay, stays packed, and looks rows up exactly
    table = ngram.load_table(overlay / index["weight_map"][f"{NGRAM_PREFIX}.head_offsets"])
    assert table.resident_bytes == pack_cache.table.resident_bytes < table.dense_bytes
    ids = torch.tensor([0, 5, 95, 96, 500, table.num_rows - 1])
    assert torch.equal(
        table.lookup(ids).view(torch.int16), pack_cache.table.dequantize_all()[ids].view(torch.int16)
    )


def test_second_prepare_writes_nothing_and_remove_undoes_it(pack_cache: PackCache) -> None:
    first = _prepare_json(pack_cache)
    overlay = Path(first["overlay"])
    marker = overlay / ".sparkctl-prepare.json"
    stamp = marker.stat().st_mtime_ns
    before = tree_state(pack_cache.hub)
    again = pack_cache.sparkctl("prepare", str(pack_cache.recipe), "--offline")
    assert again.returncode == 0, again.stderr
    assert "up to date (nothing written)" in again.stdout
    assert marker.stat().st_mtime_ns == stamp

    removed = pack_cache.sparkctl("prepare", str(pack_cache.recipe), "--remove")
    assert removed.returncode == 0 and f"removed {overlay}" in removed.stdout
    assert not overlay.exists()
    assert tree_state(pack_cache.hub) == before
    gone = pack_cache.sparkctl("prepare", str(pack_cache.recipe), "--remove")
    assert gone.returncode == 0 and "no overlay" in gone.stdout


def test_show_and_dry_run_name_the_overlay_and_serve_it(pack_cache: PackCache) -> None:
    made = _prepare_json(pack_cache)
    overlay = made["overlay"]
    show = pack_cache.sparkctl("show", str(pack_cache.recipe))
    assert show.returncode == 0, show.stderr
    assert f"overlay {overlay}" in show.stdout
    assert f"made from {pack_cache.snapshot}" in show.stdout
    assert "adds mtp_hyper_connection_mixer_patch.safetensors, ngram" in show.stdout
    dry = pack_cache.sparkctl("up", str(pack_cache.recipe), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "# prepare:" in dry.stdout and f"#   overlay {overlay}" in dry.stdout
    assert f"#   for {pack_cache.snapshot} (up to date):" in dry.stdout
    # the engine is pointed at the overlay, not at the hub id or the raw snapshot
    assert f"  --model {overlay} \\\n" in dry.stdout
    assert "--revision" not in dry.stdout


def test_overlay_inside_the_download_is_refused(pack_cache: PackCache) -> None:
    before = tree_state(pack_cache.hub)
    inside = str(pack_cache.snapshot.parent.parent / "sparkctl")
    r = pack_cache.sparkctl("prepare", str(pack_cache.recipe), "--offline", SPARKCTL_CACHE_DIR=inside)
    assert r.returncode == 2
    assert "would be inside the download" in r.stderr and "Traceback" not in r.stderr
    assert tree_state(pack_cache.hub) == before


def test_docker_plan_mounts_what_the_overlay_links_into(pack_cache: PackCache, monkeypatch) -> None:
    """In a container the overlay's absolute links must resolve: the plan mounts their blob directory at
    its own path, so the runtime needs no extra mounts (and `render` prints a runnable command)."""
    from sparkctl.planner import plan
    from sparkctl.recipe import load_recipe
    from sparkctl.runtimes.docker import link_target_mounts

    made = _prepare_json(pack_cache)
    monkeypatch.setenv("SPARKCTL_CACHE_DIR", pack_cache.env["SPARKCTL_CACHE_DIR"])
    sets = [
        "runtime=docker",
        "container.image=sparkctl-test:cpu",
        f"container.hf_cache={pack_cache.hub.parent}",
    ]
    p = plan(load_recipe(str(pack_cache.recipe), sets), check_memory=False)
    mounts = {m.target: m for m in p.container.mounts}
    name = p.recipe_name
    assert mounts[f"/models/{name}"].source == made["overlay"] and p.argv[2] == f"/models/{name}"
    blobs = str((pack_cache.snapshot.parent.parent / "blobs").resolve())
    assert mounts[blobs].source == blobs and mounts[blobs].read_only
    binds = [(Path(m.source), m.target) for m in p.container.mounts]
    assert link_target_mounts(binds) == []
    # without those mounts the links would dangle in the container (the runtime would have to add them)
    assert link_target_mounts([(Path(made["overlay"]), f"/models/{name}")]) == [(blobs, blobs)]
