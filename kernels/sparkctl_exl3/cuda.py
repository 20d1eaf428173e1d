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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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
    "moe",
    "moe_prepare",
    "moe_supports",
    "set_tuning",
    "sources",
    "supports",
    "tuned",
    "tuning",
    "unavailable_reason",
]

#: Name of the compiled module (bump the suffix when the binding's signature changes, so stale caches are ignored).
EXTENSION_NAME = "sparkctl_exl3_cuda_v5"

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
    _moe_need.clear()


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
    return _stream_workspace(device, need)


def _stream_workspace(device: torch.device, need: int) -> torch.Tensor:
    """The zeroed int32 workspace of the current stream, grown to ``need`` elements (the kernels leave it zero)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
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


# --- fused MoE decode --------------------------------------------------------------------------------------------

# Workspace size per MoE call shape (asked of the kernel's planner once; a new tuning empties it, as _workspace_need).
_moe_need: dict[tuple, int] = {}
#: Activations the fused MoE makes in its down projection's input (exl3_gemv.h, EXL3_MOE_ACT_*).
MOE_ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
_OUT_DTYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


@dataclass(frozen=True)
class MoeTables:
    """One MoE layer's experts as the fused kernel finds them on the device: made once at load time.

    ``table`` holds each local expert's (gate, up, down) x (trellis, suh, svh) device pointers, so ``keep`` must hold
    the tensors they point into for as long as the tables are used.
    """

    table: torch.Tensor  # int64 [E, 3, 3]
    sel: torch.Tensor  # int32 [E, 3]: 4 * k2 + codebook of each projection
    lookup: (
        torch.Tensor
    )  # int32 [n_global]: global expert id -> local index, -1 = not held; empty: ids are local
    hidden: int
    width: int
    gated: bool
    gu_sels: tuple[int, ...]  # distinct (k2, codebook) pairs of the gate/up projections: one launch each
    down_sels: tuple[int, ...]
    keep: tuple[torch.Tensor, ...]


def _aligned16(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def moe_supports(experts: Sequence[Mapping[str, tuple | None]]) -> bool:
    """Whether :func:`moe` takes these experts: CUDA tensors, every projection mul1 at a compiled rate, one shape."""
    module = _load()
    if module is None or not experts:
        return False
    shapes = set()
    for e in experts:
        for tag in ("gate", "up", "down"):
            w = e.get(tag)
            if w is None:
                if tag == "up":
                    continue
                return False
            trellis, suh, svh, codebook = w
            if not (trellis.is_cuda and trellis.dtype == torch.int16 and trellis.dim() == 3):
                return False
            if suh.dtype != torch.float16 or svh.dtype != torch.float16 or trellis.shape[2] % 8:
                return False
            cb = codebook if isinstance(codebook, int) else _codebook_id(codebook)
            i, o = 16 * trellis.shape[0], 16 * trellis.shape[1]
            if not module.moe_supports(i, o, trellis.shape[2] // 8, cb):
                return False
            shapes.add((tag, i, o))
    by_tag = {tag: {(i, o) for t, i, o in shapes if t == tag} for tag in ("gate", "up", "down")}
    if any(len(v) > 1 for v in by_tag.values()):
        return False
    (gi, go), (di, do) = next(iter(by_tag["gate"])), next(iter(by_tag["down"]))
    return gi == do and go == di and (not by_tag["up"] or by_tag["up"] == by_tag["gate"])


def _codebook_id(name: str) -> int:
    from .ops import CODEBOOKS

    return CODEBOOKS[name]


def moe_prepare(
    experts: Sequence[Mapping[str, tuple | None]], expert_ids: Sequence[int] | None = None
) -> MoeTables:
    """The device tables of one layer's experts for :func:`moe`.

    ``experts[i]`` maps "gate", "up" (None when not gated) and "down" to ``(trellis, suh, svh, codebook)`` (codebook
    by name or id); ``expert_ids[i]`` is expert i's global id (default: i), which is what the router's ids name.
    """
    if not moe_supports(experts):
        raise ValueError(
            "EXL3 fused MoE: the experts must be CUDA mul1 layers of one shape (gate/up [H, W], down [W, H]) at a "
            "compiled rate"
        )
    gated = experts[0].get("up") is not None
    if any((e.get("up") is not None) != gated for e in experts):
        raise ValueError("EXL3 fused MoE: some experts have an up projection and others do not")
    device = experts[0]["gate"][0].device
    keep: list[torch.Tensor] = []
    ptrs: list[list[list[int]]] = []
    sels: list[list[int]] = []
    for e in experts:
        row_p, row_s = [], []
        for tag in ("gate", "up", "down"):
            w = e.get(tag)
            if w is None:
                row_p.append([0, 0, 0])
                row_s.append(-1)
                continue
            trellis, suh, svh, codebook = w
            ts = [_aligned16(trellis), _aligned16(suh), _aligned16(svh)]
            keep.extend(ts)
            row_p.append([t.data_ptr() for t in ts])
            cb = codebook if isinstance(codebook, int) else _codebook_id(codebook)
            row_s.append(4 * (trellis.shape[2] // 8) + cb)
        ptrs.append(row_p)
        sels.append(row_s)
    ids = list(range(len(experts))) if expert_ids is None else [int(i) for i in expert_ids]
    if len(ids) != len(experts) or len(set(ids)) != len(ids) or min(ids) < 0:
        raise ValueError("EXL3 fused MoE: expert_ids must give each expert a distinct non-negative global id")
    if ids == list(range(len(experts))):
        lookup = torch.empty(0, dtype=torch.int32, device=device)
    else:
        table = [-1] * (max(ids) + 1)
        for local, gid in enumerate(ids):
            table[gid] = local
        lookup = torch.tensor(table, dtype=torch.int32, device=device)
    gate_t = experts[0]["gate"][0]
    return MoeTables(
        table=torch.tensor(ptrs, dtype=torch.int64, device=device),
        sel=torch.tensor(sels, dtype=torch.int32, device=device),
        lookup=lookup,
        hidden=16 * int(gate_t.shape[0]),
        width=16 * int(gate_t.shape[1]),
        gated=gated,
        gu_sels=tuple(sorted({s for row in sels for s in row[:2] if s >= 0})),
        down_sels=tuple(sorted({row[2] for row in sels})),
        keep=tuple(keep),
    )


def moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    tables: MoeTables,
    activation: str = "silu",
    *,
    out_dtype: torch.dtype = torch.float16,
    ksplit_gu: int = 0,
    ksplit_down: int = 0,
) -> torch.Tensor:
    """``sum_j w[t, j] * down(act(gate(x_t)) * up(x_t))`` over each token's routed experts, for fp16 ``x [T, H]``.

    Only the routed experts are computed, found on the device (no host synchronisation, CUDA-graph capturable):
    three launches for a layer of one (k2, codebook) pair, one more per extra pair. Slots routed to experts this
    rank does not hold add nothing. ``ksplit_*``: the split-K of the two GEMV launches (0 = automatic; the bench
    sweeps them).
    """
    module = _module_or_raise()
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(
            f"EXL3 fused MoE: activation {activation!r} is not one of {', '.join(MOE_ACTIVATIONS)}"
        )
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"EXL3 fused MoE: out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    if x.dim() != 2 or x.shape[-1] != tables.hidden:
        raise ValueError(f"EXL3 fused MoE: x must be [tokens, {tables.hidden}], got {tuple(x.shape)}")
    tokens, topk = (int(d) for d in topk_ids.shape)
    key = (tokens, topk, tables.hidden, tables.width, tables.gated, tables.gu_sels, tables.down_sels)
    key = (*key, int(ksplit_gu), int(ksplit_down))
    need = _moe_need.get(key)
    if need is None:
        need = int(module.moe_workspace(*key[:5], list(key[5]), list(key[6]), *key[7:]))
        _moe_need[key] = need
    workspace = _stream_workspace(x.device, max(_WORKSPACE_MIN, need))
    return module.moe(
        x,
        topk_ids,
        topk_weights,
        tables.lookup,
        tables.table,
        tables.sel,
        tables.width,
        tables.gated,
        MOE_ACTIVATIONS[activation],
        list(tables.gu_sels),
        list(tables.down_sels),
        _OUT_DTYPES[out_dtype],
        workspace,
        int(ksplit_gu),
        int(ksplit_down),
    )


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
