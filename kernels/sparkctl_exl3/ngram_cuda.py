"""The CUDA kernel of the n-gram (PLE) table lookup (``csrc/exl3_ngram.cu``), registered for the custom op.

Importing this module registers a CUDA implementation of ``torch.ops.sparkctl_exl3.ngram_lookup``: CUDA tensors
then run the kernel (one launch per shard, no host synchronisation, so it is safe under CUDA graphs), and the
reference (``ngram.lookup_reference``) only where the extension cannot be built. The kernel ships in the same
extension as the GEMV (``cuda._load()``); this module only adds its entry point, so ``cuda.py`` stays as it is.
"""

from __future__ import annotations

import warnings

import torch

from . import cuda, ngram

__all__ = ["available", "lookup", "unavailable_reason"]

_warned = False


def available() -> bool:
    """Whether the kernel can run here: the extension builds on a CUDA device and has the n-gram entry point."""
    module = cuda._load()
    return module is not None and hasattr(module, "ngram_lookup")


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    if available():
        return None
    return cuda.unavailable_reason() or "the built extension has no ngram_lookup (a stale build: rebuild it)"


def lookup(
    rows: torch.Tensor,
    shards: list[torch.Tensor],
    head_offsets: torch.Tensor,
    head_bias: torch.Tensor,
    shard_rows: int,
) -> torch.Tensor:
    """fp16 [N, dim]: the rows at global indices ``rows`` of a packed table on the GPU, decoded by the kernel.

    Rows outside the table come back as zeros (the reference raises instead: callers check ranges beforehand).
    """
    module = cuda._module_or_raise()
    if not hasattr(module, "ngram_lookup"):
        raise RuntimeError(unavailable_reason())
    device = shards[0].device
    flat = rows.reshape(-1).to(device=device, dtype=torch.int64).contiguous()
    offsets = head_offsets.to(device=device, dtype=torch.int64).contiguous()
    bias = head_bias.to(device=device, dtype=torch.float16).contiguous()
    out = torch.zeros((flat.shape[0], bias.shape[-1]), dtype=torch.float16, device=device)
    for s, shard in enumerate(shards):
        module.ngram_lookup(flat, shard.contiguous(), s * shard_rows, offsets, bias, out)
    return out


@ngram.ngram_lookup.register_kernel("cuda")
def _ngram_lookup_cuda(
    rows: torch.Tensor,
    shards: list[torch.Tensor],
    head_offsets: torch.Tensor,
    head_bias: torch.Tensor,
    shard_rows: int,
) -> torch.Tensor:
    global _warned
    if available():
        return lookup(rows, shards, head_offsets, head_bias, shard_rows)
    if not _warned:
        _warned = True
        warnings.warn(
            f"n-gram lookup runs the reference on the GPU: {unavailable_reason()}",
            RuntimeWarning,
            stacklevel=2,
        )
    return ngram.lookup_reference(rows, shards, head_offsets, head_bias, shard_rows)
