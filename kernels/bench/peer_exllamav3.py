"""exllamav3 1.6.5 as the side-by-side peer of our kernels: its own kernels, driven on OUR tensors.

Bench-only code (kernels/bench); nothing in ``sparkctl_exl3`` or ``sparkctl`` imports it. Our checkpoint tensors are
exactly exllamav3's (SPEC 1: ``trellis`` int16 ``[I/16, O/16, 16K]``, ``suh [I]``, ``svh [O]`` fp16; the codebook is
which marker tensor a layer carries), so nothing is converted: each tensor is handed to exllamav3's own Python
classes, which build their kernel arguments the way a loaded exllamav3 model does.

- :func:`gemm` runs a layer through ``exllamav3.modules.quant.exl3.LinearEXL3``: its ``forward`` (``path="auto"``)
  takes ``BC_LinearEXL3`` -> ``exl3_gemm`` up to 144 rows (with the fresh ``A_had`` scratch it allocates for m > 1;
  m = 1 may take its int8 GEMV) and reconstruct + ``hgemm_recon`` beyond; ``path="gemm"`` / ``"reconstruct"`` force
  one of the two.
- :func:`prepare_moe` builds a real ``exllamav3.modules.block_sparse_mlp.BlockSparseMLP`` around our experts
  (``Linear`` modules whose ``inner`` is a ``LinearEXL3`` of our tensors, then its own ``load_local``, which makes the
  ``MultiLinear`` pointer tables, scratch and the ``BC_BlockSparseMLP``), once; :func:`moe` calls its ``forward``.
  Only the router is replaced: the module's routing function returns the ``topk_ids`` / ``topk_weights`` given, so
  the expert paths see exactly the bench's routing. Which expert path runs is the module's own choice
  (:func:`moe_path`): 1..8 tokens ``BC_BlockSparseMLP.run_bszN`` (the two-launch fused decode, ``exl3_moe_coop``,
  routing read on the device, no host sync: capturable by design, which the bench's graph-replay check tries);
  more tokens the prefill tiers (``exl3_moe`` fused kernel for experts of up to ``fused_rows`` rows in 16/32/64-row
  tiles, the batched reconstruct tier above that, ``exl3_moe_gather``), which read the per-expert counts on the
  host (``.tolist()``) once tokens x top_k exceeds ``fused_rows``, and so are NOT capturable.

Loading (:func:`load`): a prebuilt ``exllamav3_ext*.so`` in ``.device/peer/`` (``peer_build.sh`` makes it,
``peer_unpack.sh`` puts it back there) is found first, as exllamav3's ``ext.py`` checks ``find_spec`` before it
JIT-builds; else the JIT build (MAX_JOBS=16 and TORCH_CUDA_ARCH_LIST = the device's capability unless set,
both only for the duration of the import; ~6 min on the H200).
``EXL3_EXPANDABLE_SEGMENTS=0`` is set before the import, so exllamav3 does not switch torch's caching allocator
to expandable segments under our side of the bench.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
PREBUILT_DIR = REPO / ".device" / "peer"
VERSION = "1.6.5"
EXT_NAME = "exllamav3_ext"
# exllamav3's marker constants (SPEC 1.1); LinearEXL3 only asks whether a marker tensor is there
_MARKERS = {"mcg": -877912083, "mul1": -2082680531}


class PeerUnavailable(RuntimeError):
    """exllamav3 or its extension cannot be imported here."""


class PeerUnsupported(ValueError):
    """exllamav3 has no path for this input (e.g. experts of different K in one projection)."""


_loaded: dict[str, Any] = {}


def _prebuilt(dirpath: Path) -> Path | None:
    if not dirpath.is_dir():
        return None
    found = sorted(dirpath.glob(f"{EXT_NAME}*.so"))
    return found[0] if found else None


def load(prebuilt_dir: Path | str | None = None, *, allow_jit: bool = True) -> ModuleType:
    """Import exllamav3 and its CUDA extension (prebuilt .so if present, else JIT unless ``allow_jit`` is False),
    once; raise PeerUnavailable. ``info()`` then says how it was loaded and how long it took.

    ``allow_jit=False`` is for a device command that already ran ``peer_build.sh``: if that failed or ran out of
    time, a second ~6 minute build inside the bench would only eat the time our side needs.
    """
    if "ext" in _loaded:
        return _loaded["ext"]
    if "error" in _loaded:
        raise PeerUnavailable(_loaded["error"])
    os.environ.setdefault("EXL3_EXPANDABLE_SEGMENTS", "0")
    # build settings for exllamav3's JIT only: put back afterwards, so our own extension, if it JIT-builds later in
    # the same process, still builds for what torch detects
    saved = {name: os.environ.get(name) for name in ("MAX_JOBS", "TORCH_CUDA_ARCH_LIST")}
    os.environ.setdefault("MAX_JOBS", "16")
    if torch.cuda.is_available():
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "{}.{}".format(*torch.cuda.get_device_capability()))
    try:
        return _import(prebuilt_dir, allow_jit)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _import(prebuilt_dir: Path | str | None, allow_jit: bool) -> ModuleType:
    pdir = Path(prebuilt_dir) if prebuilt_dir is not None else PREBUILT_DIR
    so = _prebuilt(pdir)
    if so is None and not allow_jit:
        _loaded["error"] = (
            f"exllamav3 {VERSION} unavailable: no prebuilt {EXT_NAME}*.so in {pdir} (JIT build off)"
        )
        raise PeerUnavailable(_loaded["error"])
    if so is not None and str(pdir) not in sys.path:
        sys.path.insert(0, str(pdir))
    t0 = time.time()
    try:
        import exllamav3  # noqa: F401  (its __init__ imports the whole package, the extension first)
        from exllamav3.ext import exllamav3_ext as ext
        from exllamav3.version import __version__
    except Exception as exc:  # ImportError, a failed JIT build (RuntimeError / CalledProcessError), ...
        first = (str(exc).strip().splitlines() or [""])[0]
        _loaded["error"] = f"exllamav3 {VERSION} unavailable: {type(exc).__name__}: {first[:300]}"
        raise PeerUnavailable(_loaded["error"]) from exc
    if __version__ != VERSION:
        _loaded["error"] = f"exllamav3 {__version__} found, the peer is pinned to {VERSION}"
        raise PeerUnavailable(_loaded["error"])
    origin = getattr(ext, "__file__", "?")
    _loaded["ext"] = ext
    _loaded["info"] = {
        "version": __version__,
        "extension": origin,
        "how": "prebuilt" if so is not None and str(pdir) in str(origin) else "jit",
        "load_s": round(time.time() - t0, 1),
    }
    return ext


def info() -> dict:
    """How the peer was loaded (version, .so path, prebuilt or jit, seconds), or the error."""
    if "error" in _loaded:
        return {"error": _loaded["error"]}
    return dict(_loaded.get("info", {}))


def _marker_kwargs(codebook: str, device: torch.device) -> dict[str, torch.Tensor | None]:
    if codebook not in ("3inst", "mcg", "mul1"):
        raise ValueError(f"unknown codebook {codebook!r}: expected 3inst, mcg or mul1")
    out: dict[str, torch.Tensor | None] = {"mcg": None, "mul1": None}
    if codebook != "3inst":
        out[codebook] = torch.tensor(_MARKERS[codebook], dtype=torch.int32, device=device)
    return out


def make_linear_exl3(
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: str,
    *,
    out_dtype: torch.dtype | None = None,
    key: str = "peer.linear",
) -> Any:
    """exllamav3's ``LinearEXL3`` over our tensors (no copy), as its loader builds one from a checkpoint."""
    load()
    from exllamav3.modules.quant.exl3 import LinearEXL3

    if trellis.dtype != torch.int16 or trellis.dim() != 3:
        raise ValueError(
            f"trellis must be int16 [I/16, O/16, 16K], got {tuple(trellis.shape)} {trellis.dtype}"
        )
    in_f, out_f = 16 * trellis.shape[0], 16 * trellis.shape[1]
    return LinearEXL3(
        None,
        in_f,
        out_f,
        suh=suh.half().contiguous(),
        svh=svh.half().contiguous(),
        trellis=trellis.contiguous(),
        out_dtype=out_dtype,
        key=key,
        **_marker_kwargs(codebook, trellis.device),
    )


_linear_cache: dict[tuple, Any] = {}


def gemm(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: str,
    *,
    path: str = "auto",
) -> torch.Tensor:
    """``y = x . W`` by exllamav3 for any number of rows; fp16 ``[..., O]``.

    ``path``: ``"auto"`` = ``LinearEXL3.forward`` (exl3_gemm up to 144 rows, reconstruct + hgemm beyond),
    ``"gemm"`` = always ``BC_LinearEXL3`` / ``exl3_gemm``, ``"reconstruct"`` = always reconstruct + hgemm. The
    ``LinearEXL3`` is made once per (tensors, codebook) and cached, so timing a call measures the forward only.
    """
    key = (trellis.data_ptr(), suh.data_ptr(), svh.data_ptr(), tuple(trellis.shape), codebook)
    lin = _linear_cache.get(key)
    if lin is None:
        lin = _linear_cache[key] = make_linear_exl3(trellis, suh, svh, codebook)
    x = x.contiguous()
    if path == "auto":
        return lin.forward(x, {})
    if path == "gemm":
        return lin.bc.run_alloc(x, lin.out_features, False)
    if path == "reconstruct":
        return lin.reconstruct_hgemm(x, None)
    raise ValueError(f"unknown path {path!r}: expected auto, gemm or reconstruct")


def gemm_path(rows: int) -> str:
    """The path ``gemm(path="auto")`` takes for this many rows (LinearEXL3.forward's own threshold)."""
    load()
    from exllamav3.modules.quant.exl3 import AUTO_RECONSTRUCT_THRESHOLD

    if rows <= AUTO_RECONSTRUCT_THRESHOLD:
        return "exl3_gemm (BC_LinearEXL3)"
    return "reconstruct + hgemm_recon"


def clear_gemm_cache() -> None:
    _linear_cache.clear()


# ----------------------------------------------------------------------------------------------------------------
# MoE
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class MoEHandle:
    """A prepared exllamav3 ``BlockSparseMLP`` over our experts (keeps every tensor it points at alive)."""

    mlp: Any
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int
    activation: str
    keep: list = field(default_factory=list, repr=False)


def _routing_from_params(
    bsz: int, cfg: Any, y: torch.Tensor, params: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for the module's router: the bench's own routing, given through ``params``."""
    return params["peer_routing"]


class _GivenRouting:
    """Non-None ``routing_gate`` so the forward asks ``routing_fn`` (never called: no ``load_routing``)."""


def prepare_moe(
    experts: Sequence[dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]]],
    *,
    top_k: int,
    activation: str = "silu",
) -> MoEHandle:
    """Build exllamav3's BlockSparseMLP over ``experts`` (dicts of ``gate``/``up``/``down`` ->
    ``(trellis, suh, svh, codebook)``), expert i = global id i. Raises PeerUnsupported where exllamav3 has no
    fused path for the layer (its ``MultiLinear`` needs one K and one codebook per projection across experts)."""
    load()
    if activation != "silu":
        raise PeerUnsupported(f"the peer drives exllamav3's MoE with silu only, got {activation!r}")
    if not experts:
        raise ValueError("no experts")
    device = experts[0]["gate"][0].device
    if device.type != "cuda":
        raise ValueError("exllamav3's MoE runs on CUDA tensors only")
    device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return _build_moe(experts, top_k, activation, device)


def _build_moe(
    experts: Sequence[dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]]],
    top_k: int,
    activation: str,
    device: torch.device,
) -> MoEHandle:
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP
    from exllamav3.modules.linear import Linear

    hidden = 16 * experts[0]["gate"][0].shape[0]
    inter = 16 * experts[0]["gate"][0].shape[1]
    for proj in ("gate", "up", "down"):
        ks = {e[proj][0].shape[-1] for e in experts}
        cbs = {e[proj][3] for e in experts}
        if len(ks) > 1 or len(cbs) > 1:
            raise PeerUnsupported(
                f"exllamav3 needs one K and one codebook per projection across experts ({proj}: "
                f"K {sorted(k / 16 for k in ks)}, codebooks {sorted(cbs)})"
            )

    def linear(i: int, proj: str) -> Any:
        trellis, suh, svh, cb = experts[i][proj]
        in_f, out_f = 16 * trellis.shape[0], 16 * trellis.shape[1]
        down = proj == "down"
        # as BlockSparseMLP builds its experts' Linear modules (GLM/Qwen architectures: fp16 intermediates)
        lin = Linear(
            config=None,
            key=f"peer.mlp.experts.{i}.{proj}_proj",
            in_features=in_f,
            out_features=out_f,
            out_dtype=torch.float if down else torch.half,
            allow_input_padding=down,
            trim_padded_out=down,
        )
        lin.device = device
        lin.inner = make_linear_exl3(trellis, suh, svh, cb, out_dtype=lin.out_dtype, key=lin.key)
        lin.quant_type = "exl3"
        return lin

    n = len(experts)
    gates = [linear(i, "gate") for i in range(n)]
    ups = [linear(i, "up") for i in range(n)]
    downs = [linear(i, "down") for i in range(n)]
    mlp = BlockSparseMLP(
        config=None,
        key="peer.mlp",
        hidden_size=hidden,
        intermediate_size=inter,
        num_experts=n,
        num_experts_per_tok=top_k,
        gates=gates,
        ups=ups,
        downs=downs,
        activation_fn=activation,
        interm_dtype=torch.half,
        out_dtype=torch.float,
    )
    mlp.device = device
    try:
        mlp.load_local()
    except AssertionError as exc:
        raise PeerUnsupported(f"exllamav3's BlockSparseMLP refused the layer: {exc}") from exc
    if mlp.bc is None:
        raise PeerUnsupported(
            "exllamav3 built no quantized MoE path for this layer (BlockSparseMLP.bc is None)"
        )
    mlp.routing_gate = _GivenRouting()
    mlp.routing_fn = _routing_from_params
    return MoEHandle(mlp, hidden, inter, n, top_k, activation, keep=[gates, ups, downs])


def moe_path(handle: MoEHandle, tokens: int) -> str:
    """Which of exllamav3's MoE paths its forward takes for ``tokens`` (the module's own conditions)."""
    from exllamav3.modules.block_sparse_mlp import MAX_BSZN

    mlp = handle.mlp
    if mlp.bc is not None and tokens <= MAX_BSZN:
        return "run_bszN: fused decode, exl3_moe_coop (2 launches, no host sync)"
    if mlp.fused_mode_buffers is not None and tokens * handle.top_k <= mlp.fused_rows:
        return f"prefill: exl3_moe fused, every expert (<= {mlp.fused_rows} assignments: no host sync)"
    if mlp.fused_mode_buffers is not None:
        return (
            f"prefill tiers: exl3_moe fused (<= {mlp.fused_rows} rows/expert, 16/32/64-row tiles) + batched "
            "reconstruct above + exl3_moe_gather (host sync on expert counts: not graph-capturable)"
        )
    return "per-expert loop: BC graph (<= 32 rows) / dequant + hgemm (host sync: not graph-capturable)"


def routing_for_peer(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The dtypes exllamav3's MoE kernels read: int64 ids, fp16 weights, contiguous (convert once, outside timing)."""
    return topk_ids.to(torch.int64).contiguous(), topk_weights.to(torch.float16).contiguous()


def moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    handle: MoEHandle,
    activation: str = "silu",
) -> torch.Tensor:
    """exllamav3's routed-expert sum for ``x [T, H]`` fp16: fp32 ``[T, H]``, as BlockSparseMLP returns it.

    For 1..8 tokens the result is a view of exllamav3's persistent output buffer (shared by every module of the
    same hidden size and overwritten by the next call): clone it to keep it.
    """
    if activation != handle.activation:
        raise ValueError(f"handle was prepared for {handle.activation!r}, not {activation!r}")
    if topk_ids.dim() != 2 or topk_ids.shape[1] != handle.top_k:
        raise ValueError(f"topk_ids must be [T, {handle.top_k}], got {tuple(topk_ids.shape)}")
    if topk_ids.dtype != torch.int64 or topk_weights.dtype != torch.float16:
        topk_ids, topk_weights = routing_for_peer(topk_ids, topk_weights)
    if x.dtype != torch.float16:
        raise ValueError(f"x must be fp16, got {x.dtype}")
    return handle.mlp.forward(x.contiguous(), {"peer_routing": (topk_ids, topk_weights)})


def _main(argv: list[str]) -> int:
    """``python kernels/bench/peer_exllamav3.py``: load the peer and print how (one line), exit 1 if it cannot."""
    try:
        load()
    except PeerUnavailable as exc:
        print(f"peer: {exc}")
        return 1
    print(f"peer: {info()}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
