"""Shard fixtures on a real disk: DONTNEED cannot evict from tmpfs, so residency tests need one."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prewarm_testlib import REPO, MiB, write_index, write_shard

from prewarm.report import filesystem_of


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
