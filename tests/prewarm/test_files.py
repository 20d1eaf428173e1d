"""Loader order and input validation: what `model_files` and `inspect_files` accept and refuse."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prewarm_testlib import MiB, as_nobody, write_index, write_shard

from prewarm import BadInput, inspect_files, model_files


def test_index_order_wins_over_names(disk_dir: Path) -> None:
    names = ["b.safetensors", "a.safetensors", "c.safetensors"]
    for n in names:
        write_shard(disk_dir / n, 1024)
    write_shard(disk_dir / "consolidated.safetensors", 1024)  # not in the index: a loader skips it
    write_index(disk_dir, names)
    assert [p.name for p in model_files(disk_dir)] == names


def test_natural_sort_without_index(disk_dir: Path) -> None:
    for i in (10, 2, 1):
        write_shard(disk_dir / f"model-{i}-of-10.safetensors", 1024)
    assert [p.name for p in model_files(disk_dir)] == [
        "model-1-of-10.safetensors",
        "model-2-of-10.safetensors",
        "model-10-of-10.safetensors",
    ]


def test_safetensors_preferred_then_gguf_then_bin(disk_dir: Path) -> None:
    (disk_dir / "training_args.bin").write_bytes(b"x")
    write_shard(disk_dir / "model.safetensors", 1024)
    assert [p.name for p in model_files(disk_dir)] == ["model.safetensors"]
    other = disk_dir / "gguf"
    (other / "IQ3_S").mkdir(parents=True)
    (other / "IQ3_S" / "m-00002-of-00002.gguf").write_bytes(b"GGUF")
    (other / "IQ3_S" / "m-00001-of-00002.gguf").write_bytes(b"GGUF")
    (other / "pytorch_model.bin").write_bytes(b"x")
    assert [p.name for p in model_files(other)] == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    only_bin = disk_dir / "bin"
    only_bin.mkdir()
    (only_bin / "pytorch_model.bin").write_bytes(b"x")
    assert [p.name for p in model_files(only_bin)] == ["pytorch_model.bin"]


def test_hidden_directories_are_skipped(disk_dir: Path) -> None:
    (disk_dir / ".cache").mkdir()
    write_shard(disk_dir / ".cache" / "partial.safetensors", 1024)
    write_shard(disk_dir / "model.safetensors", 1024)
    assert [p.name for p in model_files(disk_dir)] == ["model.safetensors"]


def test_single_files_and_duplicates(model_dir: Path) -> None:
    first = model_dir / "model-00001-of-00004.safetensors"
    files = model_files([str(first), str(model_dir)])
    assert files[0] == first.absolute() and len(files) == 4


def test_directory_without_model_files(disk_dir: Path) -> None:
    (disk_dir / "config.json").write_text("{}")
    with pytest.raises(BadInput, match="no model files"):
        model_files(disk_dir)


def test_missing_path() -> None:
    with pytest.raises(BadInput, match="no such file"):
        model_files("/nonexistent/model")


def test_index_naming_a_missing_shard(disk_dir: Path) -> None:
    write_shard(disk_dir / "a.safetensors", 1024)
    write_index(disk_dir, ["a.safetensors", "b.safetensors"])
    with pytest.raises(BadInput, match=r"missing: b\.safetensors"):
        model_files(disk_dir)


def test_broken_index(disk_dir: Path) -> None:
    write_shard(disk_dir / "a.safetensors", 1024)
    (disk_dir / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(BadInput, match="not a usable shard index"):
        model_files(disk_dir)


def test_truncated_shard_is_refused(disk_dir: Path) -> None:
    good = write_shard(disk_dir / "model-00001-of-00002.safetensors", MiB)
    short = write_shard(disk_dir / "model-00002-of-00002.safetensors", MiB // 2, declared=MiB)
    with pytest.raises(BadInput, match="truncated") as err:
        inspect_files([good, short])
    assert short.name in str(err.value) and good.name not in str(err.value)
    assert err.value.exit_code == 2


def test_header_longer_than_file(disk_dir: Path) -> None:
    p = disk_dir / "x.safetensors"
    p.write_bytes((10_000).to_bytes(8, "little") + b"{}")
    with pytest.raises(BadInput, match="truncated"):
        inspect_files([p])


@pytest.mark.slow
def test_unreadable_file(disk_dir: Path) -> None:
    p = write_shard(disk_dir / "secret.safetensors", 1024)
    p.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(BadInput, match=r"unreadable \(Permission denied\)"):
            inspect_files([p])
        return
    # Root reads anything: check in a forked child that has dropped to an unprivileged user.
    out = as_nobody(lambda: inspect_files([p]))
    assert out.startswith("BadInput") and "unreadable (Permission denied)" in out, out


def test_an_inspected_file_is_not_inspected_again(disk_dir: Path) -> None:
    p = write_shard(disk_dir / "model.safetensors", 1024)
    [info] = inspect_files([p])
    p.unlink()  # opening it again would fail: a FileInfo is passed through as it is
    assert inspect_files([info]) == [info]
