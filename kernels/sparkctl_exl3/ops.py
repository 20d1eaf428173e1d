"""torch custom ops for EXL3 layers, in the ``sparkctl_exl3`` namespace.

Why custom ops: vLLM compiles the model with torch.compile and replays decode steps as CUDA graphs. An opaque
op with a fake (meta) implementation lets both trace through an EXL3 linear without looking inside, and gives
one dispatch point: CUDA inputs go to the compiled kernel (``sparkctl_exl3.cuda``, built separately) when it is
present and supports the shape; every other case, including a CUDA machine without the extension, runs the
pure-torch reference decoder (``sparkctl_exl3.reference``), which is slow but exact.

Ops (all pure: ``mutates_args=()``, outputs are fresh tensors):

- ``torch.ops.sparkctl_exl3.exl3_gemm(x, trellis, suh, svh, codebook_id) -> y``: ``y = x . W`` for x [..., I],
  y [..., O] in x's dtype (SPEC 4).
- ``torch.ops.sparkctl_exl3.exl3_gemm_gathered(x, trellis, suh, svh, k2, codebook_ids, index) -> y``: row p of
  x [P, I] times the stacked expert ``index[p]`` (trellis [E, I/16, O/16, L], suh [E, I], svh [E, O], ``k2`` and
  ``codebook_ids`` per expert): the routed experts of a MoE layer found by tensor indexing (reference decoder).
- ``torch.ops.sparkctl_exl3.exl3_weight(trellis, suh, svh, codebook_id) -> W``: the dense fp16 [I, O] weight in
  the original basis, for prefill-sized batches where reconstruct-then-GEMM wins.
- ``torch.ops.sparkctl_exl3.had_r_128(x, pre_scale, post_scale, scale) -> y``: the block-128 Hadamard with
  optional per-element scales before and after, the input/output side of the forward pass.

``codebook_id`` is the integer of :data:`CODEBOOKS` (0 = 3INST, 1 = MCG, 2 = mul1), as the kernels number them.
The schemas are spelled out so that it stays a plain ``int`` (an inferred schema would make it a ``SymInt``,
which torch.compile may then treat as a dynamic size).
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

import torch

from . import paths, reference

__all__ = [
    "CODEBOOKS",
    "cuda_kernel",
    "exl3_gemm",
    "exl3_gemm_gathered",
    "exl3_matmul",
    "exl3_weight",
    "had_r_128",
]

#: Codebook name -> the integer id the ops and kernels take (SPEC 2.3: cb 0, 1, 2).
CODEBOOKS: dict[str, int] = {name: index for index, name in enumerate(reference.CODEBOOKS)}

_cuda_module: ModuleType | None = None
_cuda_probed = False


def _codebook_name(codebook_id: int) -> str:
    if isinstance(codebook_id, bool) or not isinstance(codebook_id, int):
        raise TypeError(
            f"codebook_id must be an int (0 = 3inst, 1 = mcg, 2 = mul1), got {type(codebook_id).__name__}"
        )
    if not 0 <= codebook_id < len(reference.CODEBOOKS):
        raise ValueError(f"unknown codebook_id {codebook_id}: expected 0 (3inst), 1 (mcg) or 2 (mul1)")
    return reference.CODEBOOKS[codebook_id]


def cuda_kernel() -> ModuleType | None:
    """The compiled-kernel module ``sparkctl_exl3.cuda`` if it imports and reports itself available, else None.

    Imported lazily and once: a CPU-only machine, or a GPU machine where the extension was not built, must still
    be able to import and run these ops (through the reference).
    """
    global _cuda_module, _cuda_probed
    if not _cuda_probed:
        _cuda_probed = True
        try:
            module = importlib.import_module(f"{__package__}.cuda")
            _cuda_module = module if module.available() else None
            why = getattr(module, "unavailable_reason", lambda: None)()
            reason = f"the CUDA extension is unavailable ({why or 'available() is False'})"
        except (ImportError, OSError, RuntimeError) as exc:
            _cuda_module = None
            reason = f"sparkctl_exl3.cuda could not be loaded: {exc}"
        if _cuda_module is None and torch.cuda.is_available():
            warnings.warn(
                f"EXL3 layers on CUDA run the slow pure-torch reference decoder: {reason}. See kernels/README.md to build them.",
                RuntimeWarning,
                stacklevel=2,
            )
    return _cuda_module


def _kernel_takes(
    kernel: ModuleType,
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook_id: int,
) -> bool:
    """Whether the compiled GEMV handles this call: the kernel module's own ``supports`` (one shape rule, the
    kernel's), never a copy of it here."""
    return bool(kernel.supports(x, trellis, suh, svh, codebook_id))


# ------------------------------------------------------------------------------------------------
# exl3_gemm
# ------------------------------------------------------------------------------------------------


@torch.library.custom_op(
    "sparkctl_exl3::exl3_gemm",
    mutates_args=(),
    schema="(Tensor x, Tensor trellis, Tensor suh, Tensor svh, int codebook_id) -> Tensor",
)
def exl3_gemm(
    x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook_id: int
) -> torch.Tensor:
    """y = x . W for an EXL3 layer; the reference decoder on every device without a kernel for it."""
    paths.hit("linear-reference")
    return reference.matmul(x, trellis, suh, svh, _codebook_name(codebook_id))


@exl3_gemm.register_kernel("cuda")
def _exl3_gemm_cuda(
    x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook_id: int
) -> torch.Tensor:
    codebook = _codebook_name(codebook_id)
    kernel = cuda_kernel()
    if kernel is not None and _kernel_takes(kernel, x, trellis, suh, svh, codebook_id):
        reference.check_layer(trellis, suh, svh, codebook)
        rows = x.reshape(-1, x.shape[-1])
        paths.hit("gemv")
        y = kernel.gemv(
            rows.contiguous(), trellis.contiguous(), suh.contiguous(), svh.contiguous(), codebook_id
        )
        return y.reshape(*x.shape[:-1], y.shape[-1])
    prefill = getattr(kernel, "prefill_supports", None) if kernel is not None else None
    if prefill is not None and prefill(x, trellis, suh, svh, codebook_id):
        # more rows than the GEMV's 8: the kernel module picks GEMV groups or reconstruct + cuBLAS by its threshold
        reference.check_layer(trellis, suh, svh, codebook)
        rows = x.reshape(-1, x.shape[-1])
        y = kernel.gemm(
            rows.contiguous(), trellis.contiguous(), suh.contiguous(), svh.contiguous(), codebook_id
        )
        return y.reshape(*x.shape[:-1], y.shape[-1])
    paths.hit("linear-reference")
    return reference.matmul(x, trellis, suh, svh, codebook)


def _check_gemm_args(
    x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook_id: int
) -> None:
    """The shape/dtype checks of the reference, run at trace time so a bad layer fails when compiled, not later."""
    reference.check_layer(trellis, suh, svh, _codebook_name(codebook_id))
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    in_features = 16 * trellis.shape[0]
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(
            f"x must have shape [..., {in_features}] to match trellis {tuple(trellis.shape)}, got {tuple(x.shape)}"
        )


@exl3_gemm.register_fake
def _exl3_gemm_fake(
    x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook_id: int
) -> torch.Tensor:
    _check_gemm_args(x, trellis, suh, svh, codebook_id)
    return x.new_empty((*x.shape[:-1], svh.shape[0]))


# ------------------------------------------------------------------------------------------------
# exl3_gemm_gathered
# ------------------------------------------------------------------------------------------------


@torch.library.custom_op(
    "sparkctl_exl3::exl3_gemm_gathered",
    mutates_args=(),
    schema="(Tensor x, Tensor trellis, Tensor suh, Tensor svh, int[] k2, int[] codebook_ids, Tensor index) -> Tensor",
)
def exl3_gemm_gathered(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    k2: list[int],
    codebook_ids: list[int],
    index: torch.Tensor,
) -> torch.Tensor:
    """Row p of x times stacked expert ``index[p]`` (``k2`` = twice each expert's bits); the reference decoder."""
    names = [_codebook_name(int(c)) for c in codebook_ids]
    return reference.matmul_gathered(x, trellis, suh, svh, [k / 2 for k in k2], names, index)


@exl3_gemm_gathered.register_fake
def _exl3_gemm_gathered_fake(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    k2: list[int],
    codebook_ids: list[int],
    index: torch.Tensor,
) -> torch.Tensor:
    if trellis.dim() != 4 or len(k2) != trellis.shape[0] or len(codebook_ids) != trellis.shape[0]:
        raise ValueError(
            "exl3_gemm_gathered: trellis must be [E, I/16, O/16, L] with one k2 and codebook per expert"
        )
    return x.new_empty((index.shape[0], svh.shape[-1]))


# ------------------------------------------------------------------------------------------------
# exl3_weight
# ------------------------------------------------------------------------------------------------


@torch.library.custom_op(
    "sparkctl_exl3::exl3_weight",
    mutates_args=(),
    schema="(Tensor trellis, Tensor suh, Tensor svh, int codebook_id) -> Tensor",
)
def exl3_weight(
    trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook_id: int
) -> torch.Tensor:
    """The dense fp16 [I, O] original-basis weight of an EXL3 layer (SPEC 4)."""
    kernel = cuda_kernel() if trellis.is_cuda else None
    reconstruct = getattr(kernel, "weight", None)
    # the kernel takes fp16 scales on the trellis' device; anything else the reference takes runs there
    if reconstruct is not None and suh.dtype == svh.dtype == torch.float16 and suh.is_cuda and svh.is_cuda:
        reference.check_layer(trellis, suh, svh, _codebook_name(codebook_id))
        paths.hit("weight-recon")
        return reconstruct(trellis.contiguous(), suh.contiguous(), svh.contiguous(), codebook_id)
    paths.hit("weight-reference")
    return reference.weight(trellis, suh, svh, _codebook_name(codebook_id))


@exl3_weight.register_fake
def _exl3_weight_fake(
    trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook_id: int
) -> torch.Tensor:
    reference.check_layer(trellis, suh, svh, _codebook_name(codebook_id))
    return trellis.new_empty((suh.shape[0], svh.shape[0]), dtype=torch.float16)


# ------------------------------------------------------------------------------------------------
# had_r_128
# ------------------------------------------------------------------------------------------------


@torch.library.custom_op("sparkctl_exl3::had_r_128", mutates_args=())
def had_r_128(
    x: torch.Tensor, pre_scale: torch.Tensor | None, post_scale: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """``((x * pre) . blockdiag(H128) * scale) * post`` over the last dim, in x's dtype (SPEC 4, 6)."""
    kernel = cuda_kernel() if x.is_cuda else None
    fast = getattr(kernel, "had_r_128", None)
    if fast is not None:
        return fast(x, pre_scale, post_scale, scale)
    return reference.had_r_128(x, pre_scale, post_scale, scale)


@had_r_128.register_fake
def _had_r_128_fake(
    x: torch.Tensor, pre_scale: torch.Tensor | None, post_scale: torch.Tensor | None, scale: float
) -> torch.Tensor:
    if not x.is_floating_point():
        raise TypeError("had_r_128 needs a floating-point tensor")
    if x.dim() == 0 or x.shape[-1] % reference.HAD_BLOCK:
        raise ValueError(
            f"had_r_128: last dim must be a multiple of {reference.HAD_BLOCK}, got shape {tuple(x.shape)}"
        )
    return torch.empty_like(x)


# ------------------------------------------------------------------------------------------------
# Python-level wrapper
# ------------------------------------------------------------------------------------------------


def exl3_matmul(
    x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook: str
) -> torch.Tensor:
    """``y = x . W`` through the ``exl3_gemm`` op, with the codebook by name ("3inst", "mcg", "mul1").

    Use this from Python code (the vLLM plugin); use ``torch.ops.sparkctl_exl3.exl3_gemm`` where an integer id is
    more convenient. Both dispatch the same way.
    """
    if not isinstance(codebook, str):
        raise TypeError(
            f"codebook must be a str (one of {', '.join(CODEBOOKS)}), got {type(codebook).__name__}"
        )
    if codebook not in CODEBOOKS:
        raise ValueError(f"unknown codebook {codebook!r}: expected one of {', '.join(CODEBOOKS)}")
    return torch.ops.sparkctl_exl3.exl3_gemm(x, trellis, suh, svh, CODEBOOKS[codebook])
