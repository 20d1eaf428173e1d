"""Is the GPU's memory the same RAM the page cache lives in (DGX Spark GB10, Jetson)?

On such hosts every cached shard page is memory the GPU cannot have, and vLLM's start-up check sees
it as used, so `up` evicts the shards while the server loads. The rule, first match wins:

1. `SPARKCTL_UNIFIED_MEMORY=1|0` forces the answer (for odd kits and for tests).
2. `/proc/device-tree/compatible` names an NVIDIA SoC (`nvidia,gb10`, `nvidia,tegra*`): integrated.
3. The NVIDIA driver reports a GPU named GB10 / Tegra / Orin / Thor (`/proc/driver/nvidia/gpus/*/information`
   or `nvidia-smi`): integrated.
4. On aarch64, `nvidia-smi` reporting memory.total as "[N/A]" means no dedicated memory: integrated.
   (Grace Hopper / Grace Blackwell report their HBM, so they are not treated as unified.)
5. Otherwise: not unified.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from pathlib import Path

_INTEGRATED_NAMES = ("gb10", "tegra", "orin", "thor", "xavier")


def _device_tree_compatible(root: Path) -> str:
    try:
        return (
            (root / "proc/device-tree/compatible")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .lower()
        )
    except OSError:
        return ""


def _driver_gpu_names(root: Path) -> list[str]:
    names = []
    for info in sorted((root / "proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.lower().startswith("model:"):
                    names.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return names


def _nvidia_smi(timeout: float = 3.0) -> list[tuple[str, str]]:
    """(name, memory.total) per GPU; empty when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.splitlines():
        name, _, mem = line.partition(",")
        if name.strip():
            rows.append((name.strip(), mem.strip()))
    return rows


def detect_unified_memory(root: str | os.PathLike[str] = "/", machine: str | None = None) -> tuple[bool, str]:
    """(unified?, why) following the rule in the module docstring; `root` lets tests use a fake /."""
    forced = os.environ.get("SPARKCTL_UNIFIED_MEMORY")
    if forced in ("0", "1"):
        return forced == "1", f"SPARKCTL_UNIFIED_MEMORY={forced}"
    base = Path(root)
    compatible = _device_tree_compatible(base)
    if "nvidia,gb10" in compatible or "nvidia,tegra" in compatible:
        return True, f"device tree: {compatible.strip()}"
    names = _driver_gpu_names(base)
    smi = _nvidia_smi() if str(root) == "/" else []
    names += [name for name, _ in smi]
    for name in names:
        if any(tag in name.lower() for tag in _INTEGRATED_NAMES):
            return True, f"integrated NVIDIA GPU: {name}"
    arch = machine or platform.machine()
    if arch in ("aarch64", "arm64") and any("n/a" in mem.lower() for _, mem in smi):
        return True, "aarch64 with an NVIDIA GPU that has no dedicated memory"
    if names:
        return False, f"discrete NVIDIA GPU: {names[0]}"
    return False, "no integrated NVIDIA GPU found"


@functools.cache
def is_unified_memory() -> bool:
    """True on hosts where page cache and GPU memory are one pool (cached for the process)."""
    return detect_unified_memory()[0]
