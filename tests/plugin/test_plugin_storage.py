"""Torch-free rules: tensor-parallel cut points, checkpoint scanning, VLLM_EXL3_* settings."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from sparkctl_exl3.vllm_plugin import settings, storage


def test_column_cut_on_128_boundaries() -> None:
    assert storage.column_cut("l", 512, 512, 0, 1) == (0, 512)  # no TP: keep everything stored
    assert storage.column_cut("l", 512, 256, 1, 2) == (256, 256)
    assert storage.column_cut("l", 1024, 256, 3, 4) == (768, 256)


def test_vocab_cut_short_last_rank() -> None:
    # a padded last partition may run past the stored columns; it gets what is there
    assert storage.column_cut("lm_head", 640, 384, 1, 2) == (384, 256)


@pytest.mark.parametrize(
    ("stored", "part", "rank", "size"),
    [(256, 64, 1, 4), (384, 192, 1, 2), (512, 200, 0, 2)],
)
def test_unaligned_column_cut_names_layer(stored: int, part: int, rank: int, size: int) -> None:
    with pytest.raises(storage.ShardCutError, match=r"model\.layers\.3\.self_attn\.k_proj.*multiple of 128"):
        storage.column_cut("model.layers.3.self_attn.k_proj", stored, part, rank, size)


def test_row_cut() -> None:
    assert storage.row_cut("o", 512, 256, 1, 2) == (256, 256)
    with pytest.raises(storage.ShardCutError, match="o_proj.*input row 192"):
        storage.row_cut("o_proj", 384, 192, 1, 2)
    with pytest.raises(storage.ShardCutError, match="stored only 256"):
        storage.row_cut("o_proj", 256, 256, 1, 2)


def _write_safetensors_header(path: Path, names: list[str]) -> None:
    header = {n: {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]} for n in names}
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0\0")


def test_scan_classifies_modules(tmp_path: Path) -> None:
    _write_safetensors_header(
        tmp_path / "model-00001-of-00002.safetensors",
        ["a.q_proj.trellis", "a.q_proj.suh", "a.q_proj.svh", "a.q_proj.mcg", "embed.weight"],
    )
    _write_safetensors_header(
        tmp_path / "model-00002-of-00002.safetensors", ["lm_head.weight", "old.su", "old.sv"]
    )
    index = storage.scan_checkpoint(tmp_path)
    assert index.files == 2
    assert index.exl3 == {"a.q_proj"}
    assert index.plain == {"embed", "lm_head"}
    assert index.legacy == {"old"}


def test_scan_rejects_garbage(tmp_path: Path) -> None:
    (tmp_path / "x.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="not a safetensors file"):
        storage.scan_checkpoint(tmp_path)


def test_settings_defaults_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in settings.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    s = settings.load()
    assert (s.op_dtype, s.scan_checkpoint, s.log_layers) == ("auto", True, False)
    monkeypatch.setenv("VLLM_EXL3_OP_DTYPE", "FLOAT16")
    monkeypatch.setenv("VLLM_EXL3_SCAN_CHECKPOINT", "0")
    s = settings.load()
    assert (s.op_dtype, s.scan_checkpoint) == ("float16", False)
    monkeypatch.setenv("VLLM_EXL3_LOG_LAYERS", "yes")
    with pytest.raises(ValueError, match="VLLM_EXL3_LOG_LAYERS='yes' is not valid: expected one of 0, 1"):
        settings.load()


def _write_shaped_header(path: Path, shapes: dict[str, list[int]]) -> None:
    header: dict = {n: {"dtype": "I16", "shape": s, "data_offsets": [0, 0]} for n, s in shapes.items()}
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)


def test_scan_counts_an_ngram_table_apart_from_exl3_modules(tmp_path: Path) -> None:
    t = "m.layers.1.ple.ple_embedding.ngram_embedding"
    _write_shaped_header(
        tmp_path / "ngram_embedding.safetensors",
        {
            f"{t}.shard_0.trellis": [4096, 51],
            f"{t}.shard_1.trellis": [1000, 51],
            f"{t}.head_bias": [16, 160],
            f"{t}.head_offsets": [16],
            f"{t}.head_vocab_sizes": [16],
            f"{t}.layer_multipliers": [3],
        },
    )
    _write_shaped_header(
        tmp_path / "model.safetensors", {"lm_head.trellis": [8, 8, 64], "lm_head.suh": [128]}
    )
    index = storage.scan_checkpoint(tmp_path)
    assert index.exl3 == {"lm_head"}  # the table's shard_<n>.trellis are not EXL3 linears
    assert index.ngram[t] == storage.NgramTableInfo((4096, 1000), 51, 16, 160, True)
    assert index.ngram[t].rows == 5096


def test_scan_refuses_an_incomplete_ngram_table(tmp_path: Path) -> None:
    _write_shaped_header(tmp_path / "n.safetensors", {"t.head_offsets": [4], "t.head_bias": [4, 160]})
    with pytest.raises(ValueError, match=r"t: incomplete n-gram \(PLE\) table.*t\.shard_0\.trellis"):
        storage.scan_checkpoint(tmp_path)
