"""Loader and Python entry points of the compiled EXL3 CUDA kernels (``kernels/csrc``).

Why a JIT build: the kernels must match the torch and CUDA of the machine they run on (torch cu130 on the Spark
image and on the lent H200), so the torch extension is compiled there, once, by ``torch.utils.cpp_extension``
into a cache directory; later imports load the cached build in well under a second. The Docker image runs
``python -m sparkctl_exl3.cuda build`` at image build time so a server never compiles at start-up.

Nothing here raises at import: :func:`available` says whether the kernels can run, and :func:`unavailable_reason`
says why not (no GPU, no nvcc, a compile error), so the torch ops can fall back to the reference decoder.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

__all__ = [
    "EXTENSION_NAME",
    "available",
    "build",
    "build_dir",
    "gemv",
    "gemv_ksplit",
    "gemv_ksplit_range",
    "set_tuning",
    "sources",
    "supports",
    "tuned",
    "tuning",
    "unavailable_reason",
]

#: Name of the compiled module (bump the suffix when the binding's signature changes, so stale caches are ignored).
EXTENSION_NAME = "sparkctl_exl3_cuda_v3"

_CSRC = Path(__file__).resolve().parent.parent / "csrc"
_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None
# Per (device, stream): the GEMV's int32 workspace: the counters that find the last block of each split column
# chunk, then the slots of the ticket or fixed-point hand-over. The kernel leaves it all zero, so one zeroed buffer
# serves every later call on that stream, CUDA graphs included; it only has to grow (a fresh zeroed buffer) for a
# bigger call.
_workspaces: dict[tuple[int, int], torch.Tensor] = {}
_WORKSPACE_MIN = 4096
# Workspace size per (device, layer shape, rows, codebook, ksplit): asked of the kernel's planner once. A new tuning
# (set_tuning) makes new plans, so it empties this: the integer kernel's slots make its workspace larger than the
# fp16 kernel's for the same layer.
_workspace_need: dict[tuple[int, ...], int] = {}
#: The planner's tuning fields (kernels/csrc/exl3_gemv.h, Exl3GemvTuning).
TUNING_FIELDS = ("mul1_fp16", "i8_max_rows", "xprep_min_rows", "smem_limit", "pdl")


def sources() -> list[Path]:
    """The files the extension is built from: every .cu kernel plus the torch binding."""
    return sorted(_CSRC.glob("*.cu")) + [_CSRC / "bindings.cpp"]


def build_dir() -> Path:
    """Where the JIT build lives: ``$SPARKCTL_EXL3_BUILD_DIR``, else a per-torch-version folder in the user cache.

    Keyed by torch and CUDA version because an extension built against one torch does not load in another.
    """
    explicit = os.environ.get("SPARKCTL_EXL3_BUILD_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("SPARKCTL_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base) if base else Path.home() / ".cache"
    if not os.environ.get("SPARKCTL_CACHE_DIR"):
        root = root / "sparkctl"
    tag = f"torch{torch.__version__}-cuda{torch.version.cuda}".replace("+", "_")
    return root / "exl3-ext" / tag


def build(verbose: bool = False) -> ModuleType:
    """Compile (or load the cached build of) the extension and return it; raises on any failure."""
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        raise RuntimeError(
            f"torch {torch.__version__} has no CUDA support; the EXL3 kernels need a CUDA build of torch"
        )
    if cpp_extension.CUDA_HOME is None:
        raise RuntimeError("nvcc not found (set CUDA_HOME); the EXL3 kernels are compiled on first use")
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        raise RuntimeError(
            "no CUDA device visible and TORCH_CUDA_ARCH_LIST unset: cannot tell which GPU to build for"
        )
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=EXTENSION_NAME,
        sources=[str(p) for p in sources()],
        extra_include_paths=[str(_CSRC)],
        extra_cflags=["-O3"],
        # SPARKCTL_EXL3_NVCC_FLAGS: extra nvcc flags for timing experiments (with a build dir of their own)
        extra_cuda_cflags=[
            "-O3",
            "-std=c++17",
            "-lineinfo",
            *shlex.split(os.environ.get("SPARKCTL_EXL3_NVCC_FLAGS", "")),
        ],
        build_directory=str(out),
        verbose=verbose,
    )


def _load() -> ModuleType | None:
    global _module, _error
    if _module is not None or _error is not None:
        return _module
    with _lock:
        if _module is None and _error is None:
            if not torch.cuda.is_available():
                _error = "no CUDA device is available to torch"
            else:
                try:
                    _module = build()
                except Exception as exc:  # a failed build must leave the reference path usable
                    _error = f"building the EXL3 CUDA extension failed: {exc}"
    return _module


def available() -> bool:
    """Whether the compiled kernels can run here (a CUDA device and a successful build)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    _load()
    return _error


def _module_or_raise() -> ModuleType:
    module = _load()
    if module is None:
        raise RuntimeError(f"the EXL3 CUDA kernels are unavailable: {_error}")
    return module


def supports(
    x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook_id: int
) -> bool:
    """Whether :func:`gemv` handles this call: fp16/int16 CUDA tensors and a shape the kernel's own rule
    (``exl3_gemv_supports``) takes, 1..8 rows. False wherever the kernels are not available."""
    if not (x.is_cuda and trellis.is_cuda and x.dtype == torch.float16 and trellis.dtype == torch.int16):
        return False
    if trellis.dim() != 3 or suh.dtype != torch.float16 or svh.dtype != torch.float16:
        return False
    last = trellis.shape[2]
    if last % 8:
        return False
    module = _load()
    if module is None:
        return False
    rows = x.numel() // max(1, x.shape[-1])
    in_f, out_f = 16 * trellis.shape[0], 16 * trellis.shape[1]
    return bool(module.supports(rows, in_f, out_f, last // 8, int(codebook_id)))


def tuning() -> dict[str, int]:
    """The planner's tuning (``Exl3GemvTuning``): read from the environment once, then only by :func:`set_tuning`."""
    return dict(_module_or_raise().tuning())


def set_tuning(**changes: int) -> None:
    """Change fields of the planner's tuning for the whole process (the bench's A/B and check paths)."""
    unknown = sorted(set(changes) - set(TUNING_FIELDS))
    if unknown:
        raise ValueError(f"unknown tuning field(s) {', '.join(unknown)}: expected {', '.join(TUNING_FIELDS)}")
    module = _module_or_raise()
    merged = {**module.tuning(), **changes}
    module.set_tuning(*(int(merged[name]) for name in TUNING_FIELDS))
    _workspace_need.clear()


@contextmanager
def tuned(**changes: int) -> Iterator[dict[str, int]]:
    """Run a block of calls under changed tuning, then put back exactly what was there before."""
    before = tuning()
    set_tuning(**changes)
    try:
        yield tuning()
    finally:
        set_tuning(**before)


def _workspace_for(
    module: ModuleType, trellis: torch.Tensor, rows: int, codebook_id: int, ksplit: int
) -> torch.Tensor:
    device = trellis.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    shape_key = (index, *trellis.shape, rows, codebook_id, ksplit)
    need = _workspace_need.get(shape_key)
    if need is None:
        need = max(_WORKSPACE_MIN, int(module.gemv_workspace(trellis, rows, codebook_id, ksplit)))
        _workspace_need[shape_key] = need
    stream = torch.cuda.current_stream(index).cuda_stream
    key = (index, stream)
    buf = _workspaces.get(key)
    if buf is not None and buf.numel() >= need:
        return buf
    if torch.cuda.is_current_stream_capturing():
        # A buffer made while capturing would belong to the graph's memory pool: make a private one instead
        # (the zeroing becomes part of the graph).
        return torch.zeros(need, dtype=torch.int32, device=device)
    buf = torch.zeros(need, dtype=torch.int32, device=device)
    _workspaces[key] = buf
    return buf


def gemv(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook_id: int,
    *,
    ksplit: int = 0,
) -> torch.Tensor:
    """``y = x . W`` for fp16 ``x [rows, I]`` (SPEC 4) on the GPU; returns fp16 ``[rows, O]``.

    Rows are processed 8 per launch. ``ksplit`` overrides the split of the input dimension (0 = automatic; the
    bench sweeps it). Unsupported inputs raise ``RuntimeError`` with the reason.
    """
    module = _module_or_raise()
    if x.dim() != 2:
        raise ValueError(f"EXL3 GEMV: x must be 2-D [rows, I], got shape {tuple(x.shape)}")
    if not trellis.is_cuda:  # let the binding give its error for a CPU tensor
        return module.gemv(x, trellis, suh, svh, int(codebook_id), trellis, int(ksplit))
    workspace = _workspace_for(module, trellis, x.shape[0], int(codebook_id), int(ksplit))
    return module.gemv(x, trellis, suh, svh, int(codebook_id), workspace, int(ksplit))


def gemv_ksplit(rows: int, in_features: int, out_features: int, k2: int, codebook_id: int) -> int:
    """The split-K the kernel picks for this shape on the current device."""
    return int(_module_or_raise().gemv_ksplit(rows, in_features, out_features, k2, codebook_id))


def gemv_ksplit_range(
    rows: int, in_features: int, out_features: int, k2: int, codebook_id: int
) -> tuple[int, int]:
    """(lo, hi): the splits the kernel accepts for this shape on the current device (under the current tuning)."""
    lo, hi = _module_or_raise().gemv_ksplit_range(rows, in_features, out_features, k2, codebook_id)
    return int(lo), int(hi)


def _main(argv: list[str]) -> int:
    """``python -m sparkctl_exl3.cuda build``: compile the extension now (image build, or before a bench)."""
    usage = "usage: python -m sparkctl_exl3.cuda build"
    if argv[:1] in (["-h"], ["--help"]):
        print(
            f"{usage}\n\ncompile the EXL3 CUDA extension now into {build_dir()} (otherwise it is built on first use)"
        )
        return 0
    if argv[:1] != ["build"]:
        print(usage, file=sys.stderr)
        return 2
    try:
        build(verbose=True)
    except Exception as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"built {EXTENSION_NAME} in {build_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
