"""The two rewrites on their own: config.json as the exl3 plugin reads it, and the index of every file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from sparkctl_exl3 import ngram
from sparkctl_exl3.checkpoint import random_exl3_layer

from sparkctl.errors import RuntimeFailure
from sparkctl.prepare.headers import read_headers
from sparkctl.prepare.index import plan_index
from sparkctl.prepare.pack_config import rewrite_config


def _exl3_file(path: Path, codebook: str = "mcg", head: bool = True) -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {
        f"model.layers.0.mlp.up_proj.{k}": v for k, v in random_exl3_layer(128, 128, 3, codebook, g).items()
    }
    if head:
        tensors.update({f"lm_head.{k}": v for k, v in random_exl3_layer(128, 256, 6, codebook, g).items()})
    save_file(tensors, str(path))


def test_published_config_mistakes_are_fixed(tmp_path: Path) -> None:
    _exl3_file(tmp_path / "model.safetensors")
    config = {
        "tie_word_embeddings": True,
        "tied_word_embeddings": True,  # exllamav3 1.4.1's misspelling
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        "text_config": {"tie_word_embeddings": True, "quantization_config": {"quant_method": "fp8"}},
    }
    new, changes = rewrite_config(config, read_headers(tmp_path))
    qc = new["quantization_config"]
    assert qc["quant_method"] == "exl3" and qc["codebook"] == "mcg"
    assert qc["original_quantization_config"]["quant_method"] == "fp8"
    assert "quantization_config" not in new["text_config"]
    assert new["tie_word_embeddings"] is False and new["text_config"]["tie_word_embeddings"] is False
    assert "tied_word_embeddings" not in new
    assert len(changes) == 6, changes
    assert config["quantization_config"]["quant_method"] == "fp8"  # the input is not modified
    again, more = rewrite_config(new, read_headers(tmp_path))
    assert again == new and more == []  # a second pass finds nothing to do


def test_exl3_declared_only_under_text_config_is_lifted(tmp_path: Path) -> None:
    _exl3_file(tmp_path / "model.safetensors", codebook="mul1", head=False)
    config = {"text_config": {"quantization_config": {"quant_method": "EXL3", "bits": 3.0}}}
    new, changes = rewrite_config(config, read_headers(tmp_path))
    assert new["quantization_config"] == {"quant_method": "exl3", "bits": 3.0, "codebook": "mul1"}
    assert any("copied from text_config" in c for c in changes)


def test_a_config_that_is_already_right_is_kept(tmp_path: Path) -> None:
    _exl3_file(tmp_path / "model.safetensors", codebook="mul1")
    config = {
        "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "exl3", "codebook": "mul1"},
    }
    assert rewrite_config(config, read_headers(tmp_path)) == (config, [])


def test_an_unquantized_pack_is_left_alone(tmp_path: Path) -> None:
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    config = {"quantization_config": {"quant_method": "fp8"}}
    assert rewrite_config(config, read_headers(tmp_path)) == (config, [])


def test_ngram_table_is_described_from_its_header(tmp_path: Path) -> None:
    _exl3_file(tmp_path / "model-00001-of-00001.safetensors", codebook="mul1")
    table = ngram.random_table(4, 100, 3, shard_rows=128)
    ngram.save_table(tmp_path / "ngram_embedding.safetensors", "m.ple.ngram_embedding", table)
    new, _ = rewrite_config({"quantization_config": {"quant_method": "exl3"}}, read_headers(tmp_path))
    desc = new["quantization_config"]["ngram_embedding"]
    assert desc == {
        "format": "exl3_ngram_trellis",
        "file": "ngram_embedding.safetensors",
        "module": "m.ple.ngram_embedding",
        "bits": 3,
        "row_dim": 160,
        "rows": 400,
        "rows_per_shard": 128,
        "num_shards": 4,
        "num_heads": 4,
        "packed_bytes": table.resident_bytes,
    }


def test_index_lists_every_file_and_refuses_a_tensor_stored_twice(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(2, 2)}, str(tmp_path / "a.safetensors"))
    save_file({"b": torch.zeros(3, dtype=torch.int16)}, str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "a.safetensors", "gone": "old.safetensors"}})
    )
    plan = plan_index(tmp_path, read_headers(tmp_path))
    assert plan.weight_map == {"a": "a.safetensors", "b": "b.safetensors"}
    assert plan.total_size == 2 * 2 * 4 + 3 * 2
    assert plan.added_files == ("b.safetensors",) and plan.dropped_files == ("old.safetensors",)
    save_file({"a": torch.ones(2, 2)}, str(tmp_path / "c.safetensors"))
    with pytest.raises(RuntimeFailure, match="stored in both a.safetensors and c.safetensors"):
        plan_index(tmp_path, read_headers(tmp_path))


def test_a_truncated_file_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(RuntimeFailure, match="not a readable safetensors file"):
        read_headers(tmp_path)
