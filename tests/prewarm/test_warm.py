"""Warm-up, eviction, O_DIRECT measurement and the steward, proven with mincore on a real disk.

No timing assertions here (performance lives in bench/prewarm_bench.py); these prove what ends up in
the page cache, that every byte is read once, and how partial/changed/interrupted runs are reported.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from prewarm_testlib import MiB, write_shard

from prewarm import EvictionSteward, Interrupted, evict, measure_disk, model_files, residency, warm
from prewarm.warm import Progress


@pytest.mark.parametrize("method", ["sendfile", "pread"])
def test_warm_fills_the_cache(model_dir: Path, method: str) -> None:
    files = model_files(model_dir)
    ev = evict(files)
    assert ev.residency_after < 0.05
    report = warm(files, workers=8, chunk_bytes=MiB, item_bytes=2 * MiB, method=method)  # type: ignore[arg-type]
    total = sum(f.stat().st_size for f in files)
    assert report.bytes_read == total == report.total_bytes
    assert sum(w.bytes for w in report.per_worker) == total
    assert report.residency_before < 0.05
    assert report.residency_after > 0.99
    assert residency(files) > 0.99
    assert not report.failed and not report.interrupted
    data = report.to_dict()
    assert data["from_disk_bytes"] > 0.95 * total
    assert [f["path"] for f in data["files"]] == [str(f) for f in files]


def test_warm_shares_the_work_between_workers(model_dir: Path) -> None:
    """Unthrottled, one thread of a loaded 2-core CI machine once took every item before the others started
    (a clean-clone run): paced at 32 MiB/s, each worker waits ~30 ms per chunk, so the others must take some."""
    files = model_files(model_dir)
    report = warm(files, workers=8, chunk_bytes=MiB, item_bytes=2 * MiB, limit_rate=32 * MiB)
    total = sum(f.stat().st_size for f in files)
    assert report.bytes_read == total == sum(w.bytes for w in report.per_worker)
    assert len({w.worker for w in report.per_worker if w.bytes}) > 1


def test_evict_empties_the_cache(model_dir: Path) -> None:
    files = model_files(model_dir)
    for f in files:
        f.read_bytes()
    assert residency(files) > 0.99
    report = evict(files)
    assert report.to_dict()["residency_before"] > 0.99
    assert report.residency_after < 0.01
    assert residency(files) < 0.01
    assert not report.warnings


def test_cold_mode_starts_from_an_empty_cache(model_dir: Path) -> None:
    files = model_files(model_dir)
    for f in files:
        f.read_bytes()
    report = warm(files, cold=True, workers=4, chunk_bytes=MiB)
    assert report.mode == "cold"
    assert report.evict_seconds is not None
    assert report.residency_before < 0.05
    assert report.residency_after > 0.99
    assert not report.to_dict()["not_cold"]


def test_measure_disk_reads_everything_but_caches_nothing(model_dir: Path) -> None:
    files = model_files(model_dir)
    evict(files)
    report = measure_disk(files, workers=4, chunk_bytes=MiB)
    assert report.bytes_read == report.total_bytes
    if report.method == "o_direct":
        assert report.residency_after < 0.05  # O_DIRECT bypassed the page cache
    else:  # a filesystem without O_DIRECT: the fallback says so
        assert report.method == "evict+pread" and "O_DIRECT is refused" in report.notes[0]


def test_progress_reaches_the_total(model_dir: Path) -> None:
    files = model_files(model_dir)
    seen: list[Progress] = []
    warm(files, workers=2, chunk_bytes=MiB, on_progress=seen.append, progress_interval=0.01)
    assert seen[-1].bytes_done == seen[-1].total_bytes
    assert seen[-1].files_done == seen[-1].files_total == 4
    assert all(a.bytes_done <= b.bytes_done for a, b in zip(seen, seen[1:], strict=False))


def test_file_changing_during_the_read_is_flagged(disk_dir: Path) -> None:
    shard = write_shard(disk_dir / "model.safetensors", 8 * MiB)
    grown = False

    def grow(p: Progress) -> None:
        nonlocal grown
        if p.bytes_done and not grown:
            with open(shard, "ab") as fh:  # a download still appending to the shard
                fh.write(b"\0" * 4096)
            grown = True

    # 4 MiB/s over 8 MiB: the read lasts ~2 s, so the append lands while it runs.
    report = warm(
        [shard], workers=2, chunk_bytes=MiB, limit_rate=4 * MiB, on_progress=grow, progress_interval=0.05
    )
    assert grown
    assert report.failed and report.files[0].changed
    assert any("changed during the read" in w for w in report.warnings)


def test_file_shrinking_during_the_read_is_flagged(disk_dir: Path) -> None:
    shard = write_shard(disk_dir / "model.safetensors", 8 * MiB)

    def shrink(p: Progress) -> None:
        if p.bytes_done and shard.stat().st_size > MiB:
            with open(shard, "r+b") as fh:
                fh.truncate(MiB)

    report = warm(
        [shard], workers=1, chunk_bytes=MiB, limit_rate=4 * MiB, on_progress=shrink, progress_interval=0.05
    )
    assert report.failed and report.files[0].changed
    assert report.bytes_read < 8 * MiB


def test_stop_event_gives_a_partial_report(disk_dir: Path) -> None:
    shard = write_shard(disk_dir / "model.safetensors", 8 * MiB)
    stop = threading.Event()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    report = warm([shard], workers=2, chunk_bytes=MiB, limit_rate=2 * MiB, stop=stop)
    timer.cancel()
    assert report.interrupted
    assert 0 < report.bytes_read < 8 * MiB


def test_ctrl_c_raises_interrupted_with_the_partial_report(disk_dir: Path) -> None:
    shard = write_shard(disk_dir / "model.safetensors", 8 * MiB)

    def ctrl_c(p: Progress) -> None:
        if p.bytes_done:
            raise KeyboardInterrupt  # what the main thread sees when the user presses Ctrl-C

    with pytest.raises(Interrupted) as exc:
        warm(
            [shard],
            workers=2,
            chunk_bytes=MiB,
            limit_rate=4 * MiB,
            on_progress=ctrl_c,
            progress_interval=0.05,
        )
    report = exc.value.report
    assert report.interrupted and 0 < report.bytes_read < 8 * MiB
    assert isinstance(exc.value, KeyboardInterrupt)
    assert not any(t.name.startswith("prewarm-") and t.is_alive() for t in threading.enumerate())


def test_steward_keeps_files_out_of_the_cache(model_dir: Path) -> None:
    files = model_files(model_dir)
    steward = EvictionSteward(files, interval=0.05).start()
    try:
        for f in files:  # a "server" loading the shards through the page cache
            f.read_bytes()
        deadline = time.monotonic() + 30  # generous: the CI box is shared and oversubscribed
        while residency(files) > 0.01 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert residency(files) < 0.01, (residency(files), steward.passes, steward.errors)
        assert steward.running
    finally:
        final = steward.stop()
    assert not steward.running
    assert steward.passes >= 1
    assert final is not None and final.residency_after < 0.01, final.to_dict()


def test_steward_as_context_manager_tolerates_missing_files(disk_dir: Path) -> None:
    present = write_shard(disk_dir / "a.safetensors", MiB)
    absent = disk_dir / "b.safetensors"  # not downloaded yet
    with EvictionSteward([present, absent], interval=0.02) as steward:
        present.read_bytes()
        time.sleep(0.2)
    assert steward.final is not None and steward.final.residency_after < 0.01
    assert not steward.errors


def test_a_failing_progress_callback_stops_the_readers(disk_dir: Path) -> None:
    shard = write_shard(disk_dir / "model.safetensors", 8 * MiB)

    def broken(p: Progress) -> None:
        raise ValueError("display went away")

    with pytest.raises(ValueError, match="display went away"):
        warm(
            [shard],
            workers=2,
            chunk_bytes=MiB,
            limit_rate=4 * MiB,
            on_progress=broken,
            progress_interval=0.05,
        )
    assert not any(t.name.startswith("prewarm-") and t.is_alive() for t in threading.enumerate())
