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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType

import torch

__all__ = [
    "EXTENSION_NAME",
    "available",
    "build",
    "build_dir",
    "gemm",
    "gemv",
    "gemv_ksplit",
    "gemv_ksplit_range",
    "moe",
    "moe_prepare",
    "moe_supports",
    "moe_prefill",
    "moe_prefill_prepare",
    "MoePrefillTable",
    "prefill_supports",
    "set_tuning",
    "sources",
    "supports",
    "tuned",
    "tuning",
    "unavailable_reason",
    "weight",
    "weights",
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
    if ab_paths_requested():
        tag += "-ab"  # the bench build has its own folder, so it never replaces the product build
    return root / "exl3-ext" / tag


def ab_paths_requested() -> bool:
    """Whether this process builds the extension with the A/B paths (``SPARKCTL_EXL3_AB_PATHS=1``).

    Why opt-in: mul1 through the fp16 kernel and the integer kernel's x' kernel are only ever taken under a bench's
    tuning (the defaults are faster), so the product build leaves their kernels out (kernels/csrc/exl3_gemv.cu);
    ``kernels/bench/run.py`` sets it to check and time them."""
    return os.environ.get("SPARKCTL_EXL3_AB_PATHS", "") == "1"


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
            *(["-DEXL3_AB_PATHS"] if ab_paths_requested() else []),
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


def ab_paths() -> bool:
    """Whether the loaded build has the A/B paths' kernels (see :func:`ab_paths_requested`); a tuning that needs them
    makes every call it reaches fail with a sentence saying so in the product build."""
    return bool(_module_or_raise().ab_paths())


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


# ------------------------------------------------------------------------------------------------
# --- reconstruction (prefill) ---
# W rebuilt as dense fp16 by kernels/csrc/exl3_recon.cu, then cuBLAS (kernels/PERF.md, "prefill", says why).
# ------------------------------------------------------------------------------------------------

#: Most rows the GEMV takes per launch (exl3_gemv.h); calls with more rows are prefill.
GEMV_MAX_ROWS = 8
#: Rows from which :func:`gemm` reconstructs W and multiplies with cuBLAS instead of running the GEMV in groups of
#: 8: measured (``kernels/bench/prefill_bench.py --sweep``, H200, kernels/PERF.md run 95): reconstruct + matmul won
#: from 48-72 rows over the eight 4096x14336 / 14336x4096, K 2/4, mul1/mcg cases; the largest is taken. (Predicted 24:
#: the reconstruction took 105-150 us, not 45-55.)
PREFILL_MIN_ROWS = 72
#: Most elements of W one :func:`gemm` call holds at once: wider layers are reconstructed and multiplied in column
#: chunks (multiples of 128), which bounds the scratch at 2 bytes times this (128 MiB).
PREFILL_CHUNK_ELEMENTS = 1 << 26
#: The MoE prefill's budget of reconstructed expert weights held at once (elements; 2 bytes each: 1 GiB).
MOE_SCRATCH_ELEMENTS = 1 << 29
#: Activations :func:`moe_prefill` takes by name (the plugin's names).
PREFILL_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": partial(torch.nn.functional.gelu, approximate="tanh"),
}


def prefill_supports(
    x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook_id: int
) -> bool:
    """Whether :func:`gemm` takes this call: fp16/int16 CUDA tensors, more rows than the GEMV's 8 and a layer the
    shape rule takes (``exl3_recon_supports``, the GEMV's rule). False wherever the kernels are not available."""
    if not (x.is_cuda and trellis.is_cuda and x.dtype == torch.float16 and trellis.dtype == torch.int16):
        return False
    if trellis.dim() != 3 or suh.dtype != torch.float16 or svh.dtype != torch.float16 or x.dim() == 0:
        return False
    last = trellis.shape[2]
    if last % 8:
        return False
    rows = x.numel() // max(1, x.shape[-1])
    if rows <= GEMV_MAX_ROWS:
        return False
    module = _load()
    if module is None or not hasattr(module, "recon_supports"):
        return False
    in_f, out_f = 16 * trellis.shape[0], 16 * trellis.shape[1]
    return bool(module.recon_supports(in_f, out_f, last // 8, int(codebook_id)))


def weight(
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook_id: int,
    *,
    col0: int = 0,
    cols: int | None = None,
) -> torch.Tensor:
    """The dense fp16 ``W [I, O]`` of one layer (SPEC 4), or its columns ``col0 .. col0 + cols`` (multiples of 128),
    from one reconstruction kernel. Bad inputs raise ``RuntimeError`` with the reason."""
    module = _module_or_raise()
    return module.reconstruct(
        trellis, suh, svh, int(codebook_id), int(col0), -1 if cols is None else int(cols)
    )


def weights(layers: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]) -> list[torch.Tensor]:
    """``W`` of several layers, ``(trellis, suh, svh, codebook_id)`` each: one launch (per 32 layers) for every group
    of layers that share shape, rate, codebook and device (a MoE layer's experts), views of one buffer per group."""
    if not layers:
        raise ValueError("weights() needs at least one layer")
    module = _module_or_raise()
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, (trellis, _suh, _svh, codebook_id) in enumerate(layers):
        groups.setdefault((tuple(trellis.shape), int(codebook_id), trellis.device), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(layers)
    for (shape, codebook_id, device), index in groups.items():
        in_f, out_f = 16 * int(shape[0]), 16 * int(shape[1])  # type: ignore[index]
        buf = torch.empty(len(index), in_f, out_f, dtype=torch.float16, device=device)  # type: ignore[arg-type]
        module.reconstruct_into(
            [layers[i][0].contiguous() for i in index],
            [layers[i][1].contiguous() for i in index],
            [layers[i][2].contiguous() for i in index],
            codebook_id,
            buf,
            0,
        )
        for j, i in enumerate(index):
            out[i] = buf[j]
    return [w for w in out if w is not None]


def gemm(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook_id: int,
    *,
    min_rows: int | None = None,
    chunk_elements: int | None = None,
) -> torch.Tensor:
    """``y = x . W`` for fp16 ``x [rows, I]`` of any row count: the GEMV (groups of 8) below ``min_rows``
    (:data:`PREFILL_MIN_ROWS`), else W reconstructed to fp16 and one cuBLAS fp16 GEMM, in column chunks of at most
    ``chunk_elements`` elements of W (:data:`PREFILL_CHUNK_ELEMENTS`)."""
    # imported here, not at module level: the image's kernel layer copies only this file (docker/Dockerfile)
    from . import paths

    module = _module_or_raise()
    if x.dim() != 2:
        raise ValueError(f"EXL3 GEMM: x must be 2-D [rows, I], got shape {tuple(x.shape)}")
    rows = int(x.shape[0])
    if 0 < rows < (PREFILL_MIN_ROWS if min_rows is None else min_rows):
        paths.hit("gemm-gemv")
        return gemv(x, trellis, suh, svh, codebook_id)
    if x.dtype != torch.float16:
        raise RuntimeError(f"EXL3 GEMM: x must be float16, got {x.dtype}")
    if trellis.dim() != 3:
        raise RuntimeError(f"EXL3 GEMM: trellis must be [I/16, O/16, 16*K], got {tuple(trellis.shape)}")
    in_f, out_f = 16 * int(trellis.shape[0]), 16 * int(trellis.shape[1])
    if x.shape[1] != in_f:
        raise RuntimeError(f"EXL3 GEMM: x has {x.shape[1]} features but the trellis has {in_f}")
    if x.device != trellis.device:
        raise RuntimeError("EXL3 GEMM: x, trellis, suh and svh must be on one device")
    paths.hit("gemm-recon")
    limit = PREFILL_CHUNK_ELEMENTS if chunk_elements is None else int(chunk_elements)
    cols = max(128, limit // in_f // 128 * 128)
    if cols >= out_f:
        return torch.matmul(x, module.reconstruct(trellis, suh, svh, int(codebook_id), 0, -1))
    y = torch.empty(rows, out_f, dtype=x.dtype, device=x.device)
    scratch = torch.empty(in_f, cols, dtype=torch.float16, device=x.device)
    for c0 in range(0, out_f, cols):
        n = min(cols, out_f - c0)
        w = scratch[:, :n]  # rows strided by `cols`: the kernel and cuBLAS both take a row stride
        module.reconstruct_into([trellis], [suh], [svh], int(codebook_id), w, c0)
        torch.mm(x, w, out=y[:, c0 : c0 + n])
    return y


def _row_class(count: int) -> int:
    """Rows an expert with ``count`` routed pairs is padded to in the batched GEMMs: multiples of 16 up to 64, then
    steps of at most 25% (so padding wastes at most a quarter of a class's GEMM work, and a layer has a handful of
    classes, i.e. a handful of launches, whatever its expert count)."""
    if count <= 64:
        return max(16, -(-count // 16) * 16)
    rows = 64
    while rows < count:
        rows = -(-(rows * 5 // 4) // 16) * 16
    return rows


@dataclass(frozen=True)
class MoePrefillTable:
    """One MoE layer's experts as :func:`moe_prefill` reads them, checked and listed once (at load time in the
    plugin): a prefill call's host work is then its routing plan and its launches only. Measured in the engine
    (kernels/PERF.md, "Model speed"): rebuilt per call, the lists and checks of 128 experts plus a plan of one
    small op per unit kept vLLM's prefill host-bound (GPU idle a third of the layer)."""

    n_experts: int
    gated: bool
    hidden: int
    width: int
    #: weight elements of one expert (all projections)
    per_expert: int
    #: projection name -> per expert: (trellis, suh, svh) contiguous, and the launch key (trellis shape, codebook id)
    tensors: Mapping[str, tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...]]
    keys: Mapping[str, tuple[tuple[tuple[int, ...], int], ...]]


def moe_prefill_prepare(
    experts: Sequence[Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, str | int]]],
) -> MoePrefillTable:
    """The :class:`MoePrefillTable` of ``experts`` (``{"gate": (trellis, suh, svh, codebook), "up": ..., "down":
    ...}`` each, "up" may be missing; experts may differ in K and codebook but not in shape)."""
    if not experts:
        raise ValueError("moe_prefill needs at least one expert")
    names = [n for n in ("gate", "up", "down") if n in experts[0]]
    shape_of = {name: tuple(experts[0][name][0].shape[:2]) for name in names}
    for e, ex in enumerate(experts):
        got = {name: tuple(ex[name][0].shape[:2]) for name in ex if name in ("gate", "up", "down")}
        if got != shape_of:
            raise ValueError(
                f"moe_prefill: expert {e}'s projections {got} differ in shape from expert 0's {shape_of}"
            )
    if shape_of["down"] != (shape_of["gate"][1], shape_of["gate"][0]):
        raise ValueError(
            f"moe_prefill: gate must be [hidden, width] and down [width, hidden], got trellis tiles {shape_of}"
        )
    tensors, keys = {}, {}
    for name in names:
        rows = [ex[name] for ex in experts]
        tensors[name] = tuple((t.contiguous(), u.contiguous(), v.contiguous()) for t, u, v, _ in rows)
        keys[name] = tuple(
            (tuple(t.shape), cb if isinstance(cb, int) else _codebook_id(cb)) for t, _, _, cb in rows
        )
    return MoePrefillTable(
        n_experts=len(experts),
        gated="up" in names,
        hidden=16 * int(shape_of["gate"][0]),
        width=16 * int(shape_of["gate"][1]),
        per_expert=256 * sum(int(a) * int(b) for a, b in shape_of.values()),
        tensors=tensors,
        keys=keys,
    )


def moe_prefill(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: MoePrefillTable | Sequence[Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]]],
    activation: str | Callable[[torch.Tensor], torch.Tensor] = "silu",
    *,
    intermediate: int | None = None,
    scratch_elements: int | None = None,
) -> torch.Tensor:
    """The routed experts of a MoE layer for many tokens: ``sum_j w[t, j] * down(act(gate(x_t)) * up(x_t))`` over
    token t's slots j, for ``x [tokens, hidden]`` fp16, ``topk_ids``/``topk_weights [tokens, top_k]``.

    ``experts``: a :class:`MoePrefillTable` (:func:`moe_prefill_prepare`), or the experts it is made of. Pairs are
    sorted by expert on the GPU; the counts per expert come to the host once (the layer's one sync), so only routed
    experts are reconstructed. Experts are grouped by row class (:func:`_row_class`) and, within
    ``scratch_elements`` of fp16 weights at a time (:data:`MOE_SCRATCH_ELEMENTS`), reconstructed by grouped launches
    (gate and up side by side, so one GEMM makes both) and run as batched cuBLAS GEMMs over the class, any number of
    rows per expert. Every unit's rows are gathered by one index built on the host from the counts (one copy to
    the device); each unit's routing-weighted rows are added back in fp32 (``index_add_``). Ids outside
    ``0 .. n_experts - 1`` (another rank's experts) add nothing. ``intermediate``: the true width when gate/up
    are padded past it (their extra columns are zeroed before down, as the plugin's cut does).
    """
    act = PREFILL_ACTIVATIONS[activation] if isinstance(activation, str) else activation
    if (
        x.dim() != 2
        or topk_ids.shape != topk_weights.shape
        or topk_ids.dim() != 2
        or topk_ids.shape[0] != x.shape[0]
    ):
        raise ValueError(
            f"moe_prefill: x must be [tokens, hidden] and topk_ids, topk_weights [tokens, top_k], got "
            f"{tuple(x.shape)}, {tuple(topk_ids.shape)}, {tuple(topk_weights.shape)}"
        )
    table = experts if isinstance(experts, MoePrefillTable) else moe_prefill_prepare(experts)
    module = _module_or_raise()
    tokens, top_k, hidden = int(topk_ids.shape[0]), int(topk_ids.shape[1]), int(x.shape[1])
    n_exp, width, gated = table.n_experts, table.width, table.gated
    if table.hidden != hidden:
        raise ValueError(f"moe_prefill: x has {hidden} features; the experts' gate takes {table.hidden}")
    dev = x.device
    ids = topk_ids.reshape(-1).to(torch.int64)
    key = torch.where((ids >= 0) & (ids < n_exp), ids, n_exp)  # other ranks' experts sort past the end
    order = torch.argsort(key, stable=True)
    pairs = int(order.shape[0])
    # one extra slot past the pairs: padding rows read token `tokens` (a zero row) with weight 0
    token_sorted = torch.cat([order // top_k, order.new_full((1,), tokens)])
    weight_sorted = torch.cat(
        [
            topk_weights.reshape(-1).to(torch.float32).index_select(0, order),
            order.new_zeros(1, dtype=torch.float32),
        ]
    )
    x_ext = torch.cat([x, x.new_zeros(1, hidden)])
    out = torch.zeros(tokens + 1, hidden, dtype=torch.float32, device=dev)
    counts = torch.bincount(key, minlength=n_exp + 1).tolist()  # the one host sync of the layer
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    budget = max(
        table.per_expert, MOE_SCRATCH_ELEMENTS if scratch_elements is None else int(scratch_elements)
    )
    # units of work: experts of one row class (members ordered by launch key, so one rate is one launch), at most
    # `budget` elements of weights each
    classes: dict[int, list[int]] = {}
    for e in range(n_exp):
        if counts[e] > 0:
            classes.setdefault(_row_class(counts[e]), []).append(e)
    first = table.keys["gate"]
    units: list[tuple[int, list[int]]] = []
    per_unit = max(1, budget // table.per_expert)
    for rows in sorted(classes):
        members = sorted(classes[rows], key=lambda e: (first[e], e))
        for i in range(0, len(members), per_unit):
            units.append((rows, members[i : i + per_unit]))
    if not units:
        return out[:tokens].to(x.dtype)
    # every unit's pair index (member-major, `rows` slots per member, padding slots -> `pairs`), built on the host
    # from the counts in a few vectorised ops and copied to the device once
    import numpy as np  # here: the image's kernel build layer imports this file without numpy

    # (numpy: torch's CPU repeat_interleave took milliseconds per call inside vLLM's worker, kernels/PERF.md)
    m_rows = np.array([rows for rows, members in units for _ in members], dtype=np.int64)
    m_start = np.array([starts[e] for _, members in units for e in members], dtype=np.int64)
    m_count = np.array([counts[e] for _, members in units for e in members], dtype=np.int64)
    total = int(m_rows.sum())
    slot = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(m_rows) - m_rows, m_rows)
    pos_host = np.where(slot < np.repeat(m_count, m_rows), np.repeat(m_start, m_rows) + slot, pairs)
    pos = torch.from_numpy(pos_host).to(dev)
    tok = token_sorted[pos]
    wts = weight_sorted[pos].unsqueeze(1)
    most = max(len(members) for _, members in units)
    w_in_all = torch.empty(most, hidden, (2 if gated else 1) * width, dtype=torch.float16, device=dev)
    w_down_all = torch.empty(most, width, hidden, dtype=torch.float16, device=dev)
    done = 0
    for rows, members in units:
        n = len(members)
        span = slice(done, done + n * rows)
        done += n * rows
        w_in, w_down = w_in_all[:n], w_down_all[:n]
        _reconstruct_experts(module, table, members, "gate", w_in[:, :, :width])
        if gated:
            _reconstruct_experts(module, table, members, "up", w_in[:, :, width:])
        _reconstruct_experts(module, table, members, "down", w_down)
        g = torch.bmm(x_ext.index_select(0, tok[span]).view(n, rows, hidden), w_in)
        h = act(g[..., :width].float())
        if gated:
            h.mul_(g[..., width:])
        if intermediate is not None and intermediate < width:
            h[..., intermediate:] = 0.0
        y = torch.bmm(h.to(x.dtype), w_down)
        out.index_add_(0, tok[span], torch.mul(y.view(n * rows, hidden), wts[span]))  # fp16 * fp32 -> fp32
    return out[:tokens].to(x.dtype)


def _reconstruct_experts(
    module: ModuleType, table: MoePrefillTable, members: Sequence[int], name: str, out: torch.Tensor
) -> None:
    """W of projection ``name`` of ``members`` into ``out[i]``: one launch per run of members that share rate and
    codebook (a layer of one K: one launch)."""
    keys, tensors = table.keys[name], table.tensors[name]
    i = 0
    while i < len(members):
        k = keys[members[i]]
        j = i + 1
        while j < len(members) and keys[members[j]] == k:
            j += 1
        run = [tensors[m] for m in members[i:j]]
        module.reconstruct_into(
            [r[0] for r in run], [r[1] for r in run], [r[2] for r in run], k[1], out[i:j], 0
        )
        i = j


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
