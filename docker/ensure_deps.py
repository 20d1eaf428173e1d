"""Build step of docker/Dockerfile: check what the serving image needs, install what the base lacks.

Works on any base with Python >= 3.11 and pip. Each component is looked for first; a missing one is
installed from its pinned wheel (the pins are build args, set by `sparkctl build` from sparkctl/pins.py).
A component the base already carries at a *different* version fails the build, with both versions: the
image's labels promise the pinned versions, and silently replacing a base's torch breaks its vLLM.
Runs with the image's own Python and the standard library only (sparkctl is not installed yet).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PIP = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]


def arg(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        sys.exit(f"ensure_deps: build arg {name} is empty")
    return value


def release(version: str) -> tuple[int, ...]:
    """2.14.0+cu130 -> (2, 14, 0); 2.14.0a0+nv -> (2, 14, 0): local tags and pre-release marks aside."""
    m = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_or_plan(dist: str, want: str, todo: list[str], report: list[str]) -> None:
    have = installed(dist)
    if have is None:
        todo.append(f"{dist}=={want}")
        report.append(f"{dist}: missing, installing {want}")
    elif release(have) != release(want):
        sys.exit(
            f"ensure_deps: the base has {dist} {have}, sparkctl's pins say {want}: "
            "use a base without it or with the pinned version (docker/README.md, Choosing the base)"
        )
    else:
        report.append(f"{dist}: {have} (from the base)")


def nvcc_path() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    found = shutil.which("nvcc") or (
        str(Path(cuda_home, "bin", "nvcc")) if Path(cuda_home, "bin", "nvcc").is_file() else None
    )
    return found


def site_cuda_root() -> Path | None:
    """Where the nvidia-* cu13 wheels put the toolkit (bin/nvcc, include, lib)."""
    try:
        import nvidia  # namespace package of the nvidia-* wheels
    except ImportError:
        return None
    for root in nvidia.__path__:
        cand = Path(root, "cu13")
        if cand.is_dir():
            return cand
    return None


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036  (the base image's Python, not ours)
        sys.exit(f"ensure_deps: Python {sys.version.split()[0]} is too old; the image needs >= 3.11")
    report: list[str] = [f"python: {sys.version.split()[0]}"]
    todo: list[str] = []
    check_or_plan("vllm", arg("VLLM_VERSION"), todo, report)
    check_or_plan("torch", arg("TORCH_VERSION"), todo, report)
    check_or_plan("flashinfer-python", arg("FLASHINFER_VERSION"), todo, report)
    if not (shutil.which("ninja") or installed("ninja")):
        todo.append(f"ninja=={arg('NINJA_VERSION')}")
        report.append("ninja: missing, installing")
    if os.environ.get("INSTALL_RAY", "1") == "1":
        check_or_plan("ray", arg("RAY_VERSION"), todo, report)
    nvcc = nvcc_path()
    if nvcc is None:
        # the toolkit release torch itself pins, so nvcc, its nvvm and headers match torch's CUDA libraries
        todo.append(f"cuda-toolkit[nvcc]=={arg('CUDA_TOOLKIT_VERSION')}")
        report.append("nvcc: missing, installing cuda-toolkit[nvcc] (PyPI)")
    else:
        report.append(f"nvcc: {nvcc}")
    if not (shutil.which("cuobjdump") or (nvcc and Path(nvcc).with_name("cuobjdump").is_file())):
        todo.append(f"nvidia-cuda-cuobjdump=={arg('CUOBJDUMP_VERSION')}")
        report.append("cuobjdump: missing, installing the nvidia-cuda-cuobjdump wheel")
    if todo:
        cmd = [*PIP, *todo]
        print("ensure_deps: " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            sys.exit("ensure_deps: pip could not install the pinned wheels (its error is above)")
    if nvcc is None:
        # the wheel's toolkit (bin/nvcc + include + lib) becomes CUDA_HOME, where torch's extension
        # builder and FlashInfer's JIT look for it
        root = site_cuda_root()
        cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
        if root is None or not (root / "bin" / "nvcc").is_file():
            sys.exit("ensure_deps: cuda-toolkit[nvcc] installed no nvidia/cu13/bin/nvcc")
        if not cuda_home.exists():
            cuda_home.symlink_to(root, target_is_directory=True)
        if not (root / "lib64").exists() and (root / "lib").is_dir():
            (root / "lib64").symlink_to("lib", target_is_directory=True)
    import torch  # after installing: the check that matters is what the server will import

    cuda = torch.version.cuda or "none"
    want_cuda = arg("CUDA_VERSION")
    if cuda.split(".")[0] != want_cuda.split(".")[0]:
        sys.exit(
            f"ensure_deps: torch {torch.__version__} is built for CUDA {cuda}, the image needs {want_cuda}"
        )
    report.append(f"torch CUDA: {cuda}")
    subprocess.run([nvcc_path() or "nvcc", "--version"], check=True)
    print("ensure_deps:\n  " + "\n  ".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
