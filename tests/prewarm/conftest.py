"""Shard fixtures on a real disk: DONTNEED cannot evict from tmpfs, so residency tests need one."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm.report import filesystem_of

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def write_shard(path: Path, nbytes: int, *, declared: int | None = None) -> Path:
    """A valid safetensors file with one U8 tensor of `nbytes` random bytes.

    `declared` makes the header claim a different tensor size (a truncated download).
    """
    size = nbytes if declared is None else declared
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)))
        fh.write(header)
        fh.write(os.urandom(nbytes))
        fh.flush()
        os.fsync(fh.fileno())  # so DONTNEED can drop the pages at once (no dirty pages left)
    return path


def write_index(model_dir: Path, order: list[str]) -> None:
    weight_map = {f"layer.{i}.weight": name for i, name in enumerate(order)}
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


@pytest.fixture
def disk_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on a filesystem where page-cache eviction works (not tmpfs)."""
    if filesystem_of(tmp_path) not in ("tmpfs", "ramfs"):
        yield tmp_path
        return
    base = REPO / "build" / "test-tmp"
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(dir=base))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def model_dir(disk_dir: Path) -> Path:
    """Four 4 MiB shards, with an index, in the directory a real snapshot would have them."""
    d = disk_dir / "model"
    d.mkdir()
    names = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
    for name in names:
        write_shard(d / name, 4 * MiB)
    write_index(d, names)
    (d / "config.json").write_text("{}")
    return d


def prewarm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "prewarm", *args]
