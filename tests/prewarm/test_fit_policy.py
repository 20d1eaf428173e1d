"""Fit check, cgroup limits, unified-memory detection and the `up` load decision, on given inputs."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import psutil
import pytest

from prewarm import decide, detect_unified_memory, fit_check, memory_status
from prewarm.cli import parse_size
from prewarm.errors import BadInput
from prewarm.fit import GiB, MemoryStatus, cgroup_memory


def mem(total: float, avail: float, limit: float | None = None, usage: float = 0) -> MemoryStatus:
    lim = int(limit * GiB) if limit is not None else None
    return MemoryStatus(
        int(total * GiB),
        int(avail * GiB),
        lim,
        int(usage * GiB) if lim else None,
        "/sys/fs/cgroup/x" if lim else None,
    )


def test_fit_uses_mem_available_and_headroom() -> None:
    spark = mem(121.7, 110)
    assert fit_check(int(90 * GiB), memory=spark).fits  # 90 + 12.2 (10 %) <= 110
    refused = fit_check(int(100 * GiB), memory=spark)
    assert not refused.fits and "would leave less than 12.2 GiB" in refused.message
    assert fit_check(int(100 * GiB), memory=spark, headroom=0).fits
    assert fit_check(int(4 * GiB), memory=mem(16, 11)).headroom_bytes == 8 * GiB  # the 8 GiB floor


def test_cgroup_limit_caps_what_is_available() -> None:
    boxed = mem(121.7, 110, limit=64, usage=20)
    assert boxed.available == 44 * GiB
    r = fit_check(int(40 * GiB), memory=boxed)
    assert not r.fits and "cgroup /sys/fs/cgroup/x limit" in r.message


def test_cgroup_v2_and_v1_parsing(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "user.slice").mkdir(parents=True)
    (v2 / "user.slice" / "memory.max").write_text("8589934592\n")
    (v2 / "user.slice" / "memory.current").write_text("1073741824\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice\n")
    assert cgroup_memory(proc, v2) == (8 << 30, 1 << 30, str(v2 / "user.slice"))
    (v2 / "user.slice" / "memory.max").write_text("max\n")
    assert cgroup_memory(proc, v2) == (None, None, None)
    # v1, inside a container: the process's path is not visible, the mount root is its cgroup
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("4294967296\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("100\n")
    proc.write_text("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n")
    assert cgroup_memory(proc, v1) == (4 << 30, 100, str(v1 / "memory"))
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory(proc, v1) == (None, None, None)


def test_memory_status_on_this_host() -> None:
    st = memory_status()
    vm = psutil.virtual_memory()
    assert st.total == vm.total
    assert 0 < st.available <= st.total


def test_unified_memory_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKCTL_UNIFIED_MEMORY", raising=False)
    spark = tmp_path / "spark"
    (spark / "proc/device-tree").mkdir(parents=True)
    (spark / "proc/device-tree/compatible").write_bytes(b"nvidia,gb10\0nvidia,tegra\0")
    assert detect_unified_memory(spark)[0] is True
    driver_only = tmp_path / "drv"
    (driver_only / "proc/driver/nvidia/gpus/000f:01:00.0").mkdir(parents=True)
    (driver_only / "proc/driver/nvidia/gpus/000f:01:00.0/information").write_text(
        "Model: \t NVIDIA GB10\nIRQ: 1\n"
    )
    assert detect_unified_memory(driver_only, machine="aarch64") == (
        True,
        "integrated NVIDIA GPU: NVIDIA GB10",
    )
    h200 = tmp_path / "h200"
    (h200 / "proc/driver/nvidia/gpus/0000:01:00.0").mkdir(parents=True)
    (h200 / "proc/driver/nvidia/gpus/0000:01:00.0/information").write_text("Model: \t NVIDIA H200\n")
    assert detect_unified_memory(h200, machine="x86_64") == (False, "discrete NVIDIA GPU: NVIDIA H200")
    assert detect_unified_memory(tmp_path / "empty")[0] is False
    monkeypatch.setenv("SPARKCTL_UNIFIED_MEMORY", "1")
    assert detect_unified_memory(tmp_path / "empty") == (True, "SPARKCTL_UNIFIED_MEMORY=1")


def test_this_host_is_not_unified_without_an_integrated_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKCTL_UNIFIED_MEMORY", raising=False)
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists() or platform.machine() == "aarch64":
        pytest.skip("this host has NVIDIA hardware or is aarch64; the fake-root test covers the rule")
    assert detect_unified_memory() == (False, "no integrated NVIDIA GPU found")


def test_load_decision() -> None:
    spark = mem(121.7, 110)
    big = fit_check(int(91 * GiB), memory=spark)
    small = fit_check(int(10 * GiB), memory=spark)
    # a 91 GiB pack on a Spark: the loader's copy plus a warm cache cannot both fit; evict while loading
    d = decide("auto", fit=big, unified=True)
    assert not d.warm and d.evict_during_load and "unified memory" in d.reason
    assert decide("auto", fit=small, unified=True).warm  # 2 x 10 + 12.2 <= 110
    assert decide("auto", fit=big, unified=False).warm
    assert not decide("never", fit=small, unified=False).warm
    assert decide("always", fit=big, unified=True).warm
    too_big = fit_check(int(105 * GiB), memory=spark)
    assert not decide("always", fit=too_big, unified=True).warm
    assert not decide("auto", fit=small, unified=True, evict_after_load=False).evict_during_load


def test_parse_size() -> None:
    assert parse_size("16M") == 16 << 20
    assert parse_size("16MiB") == 16 << 20
    assert parse_size("1.5G") == 3 << 29
    assert parse_size("4096") == 4096
    with pytest.raises(BadInput):
        parse_size("lots")
