"""Where symlinks in mounted directories point, and which extra mounts make them resolve in a container
(pure path logic: no engine needed)."""

from __future__ import annotations

import pytest
from dockerkit import fake_hf_snapshot

from sparkctl.errors import RuntimeFailure


def test_link_target_mounts_only_when_needed(tmp_path) -> None:
    from sparkctl.runtimes.docker import link_target_mounts

    snap = fake_hf_snapshot(tmp_path / "hf")
    blobs = str(snap.parent.parent / "blobs")
    assert link_target_mounts([(snap, "/models/tiny")]) == [(blobs, "/blobs")]
    # the whole cache mounted elsewhere, snapshot addressed through it: links already resolve
    assert link_target_mounts([(tmp_path / "hf", "/root/.cache/huggingface")]) == []
    # absolute links get their directory mounted at the same path
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "other").write_text("x")
    (snap / "other.json").symlink_to(tmp_path / "elsewhere" / "other")
    elsewhere = str(tmp_path / "elsewhere")
    assert sorted(link_target_mounts([(snap, "/models/tiny")])) == sorted(
        [(blobs, "/blobs"), (elsewhere, elsewhere)]
    )
    # two snapshots whose links meet at the same container path from different blob stores: refused
    other = fake_hf_snapshot(tmp_path / "hf2")
    with pytest.raises(RuntimeFailure, match="would not resolve inside the container"):
        link_target_mounts([(snap, "/models/tiny"), (other, "/models/other")])
