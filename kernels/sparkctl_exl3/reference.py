"""Pure-torch EXL3 reference decoder: the executable form of ``shared/exl3/SPEC.md``.

This module is the oracle for the CUDA kernels and the CPU path of the vLLM plugin, so it favours
being obviously right over being fast: every step is a direct, vectorised transcription of one
section of the spec, computed in wide integer / fp32 arithmetic that rounds to fp16 exactly once.

Pipeline (SPEC 8):

    trellis int16 [I/16, O/16, L]   --unpack_states-->   16-bit states [I/16, O/16, 256]   (SPEC 2.1, 2.2, 2.5)
    states                          --decode_table--->   fp16 values in trellis order      (SPEC 2.3)
    trellis order                   --tile permutation-> W_hat fp16 [I, O], rotated basis   (SPEC 3)
    W_hat, suh, svh                 --Hadamards------->  W fp16 [I, O], original basis      (SPEC 4)
    x                               --forward--------->  y = x . W                          (SPEC 4)

Everything runs on whatever device the inputs live on (CPU or CUDA); the lookup tables are built
once on the CPU and cached per device.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache

import torch

__all__ = [
    "CODEBOOKS",
    "HAD_BLOCK",
    "MARKERS",
    "bits_of",
    "check_layer",
    "codebook_of",
    "decode_table",
    "had_r_128",
    "hadamard_128",
    "matmul",
    "matmul_gathered",
    "tile_permutation",
    "unpack_states",
    "w_hat",
    "weight",
]

#: Codebook names, in the numeric order exllamav3 and our kernels use (cb 0, 1, 2; SPEC 2.3).
CODEBOOKS: tuple[str, ...] = ("3inst", "mcg", "mul1")

#: The only marker values a checkpoint may carry, as the int32 scalars safetensors stores (SPEC 1.1).
MARKERS: dict[str, int] = {
    "mcg": 0xCBAC1FED - (1 << 32),  # -877912083
    "mul1": 0x83DCD12D - (1 << 32),  # -2082680531
}

#: Hadamard block size on both sides of the weight (SPEC 4).
HAD_BLOCK = 128

TILE = 16  # a trellis tile is 16x16 weights (SPEC 1.1, 3)
TILE_WEIGHTS = TILE * TILE

# Integer rates 1..8 (SPEC 2.4) and half-integer rates KA + 0.5 (SPEC 2.5: the pack kernel accepts KA 1..7;
# the converter writes 1.5 / 2.5 / 3.5).
_INT_RATES = range(1, 9)
_HALF_RATES = range(1, 8)

# Bound on the number of 16-bit states decoded at once, so a 4096x14336 layer does not need gigabytes of
# int32 temporaries (the loop runs over blocks of tile rows, never over individual weights).
_STATES_PER_CHUNK = 1 << 22


# ------------------------------------------------------------------------------------------------
# Argument checks. Errors are ValueError / TypeError with the reason, since callers (the plugin's
# loader, the kernel harness) turn them into user-facing messages.
# ------------------------------------------------------------------------------------------------


def _check_codebook(codebook: str) -> str:
    if not isinstance(codebook, str):
        raise TypeError(
            f"codebook must be a str (one of {', '.join(CODEBOOKS)}), got {type(codebook).__name__}"
        )
    if codebook not in CODEBOOKS:
        raise ValueError(f"unknown codebook {codebook!r}: expected one of {', '.join(CODEBOOKS)}")
    return codebook


def _check_trellis(trellis: torch.Tensor) -> None:
    if not isinstance(trellis, torch.Tensor):
        raise TypeError(f"trellis must be a torch.Tensor, got {type(trellis).__name__}")
    if trellis.dtype != torch.int16:
        raise TypeError(f"trellis must be int16 (as stored in EXL3 checkpoints), got {trellis.dtype}")
    if trellis.dim() != 3:
        raise ValueError(
            f"trellis must have shape [I/16, O/16, 16*K] (3 dims), got {tuple(trellis.shape)} ({trellis.dim()} dims)"
        )
    if trellis.shape[0] == 0 or trellis.shape[1] == 0:
        raise ValueError(f"trellis has an empty tile grid: shape {tuple(trellis.shape)}")


def bits_of(trellis: torch.Tensor) -> float:
    """Bits per weight K of a packed trellis, from its last dim alone (SPEC 1.1: K is stored nowhere else).

    ``16*K`` int16 per tile for K = 1..8, ``16*KA + 8`` for the half-integer rates K = KA + 0.5 (SPEC 2.5).
    """
    _check_trellis(trellis)
    length = int(trellis.shape[-1])
    if length % 16 == 0 and length // 16 in _INT_RATES:
        return float(length // 16)
    if length % 16 == 8 and length // 16 in _HALF_RATES:
        return length // 16 + 0.5
    raise ValueError(
        f"trellis last dim {length} is not a valid EXL3 tile length: expected 16*K for K in 1..8 "
        f"(16, 32, ..., 128) or 16*KA+8 for K = KA+0.5, KA in 1..7 (24, 40, ..., 120)"
    )


def _check_bits(bits: float, length: int) -> None:
    """A bits value must be a supported rate and agree with the stored tile length."""
    if isinstance(bits, bool) or not isinstance(bits, int | float):
        raise TypeError(f"bits must be a number, got {type(bits).__name__}")
    whole = math.floor(bits)
    if bits == whole and whole in _INT_RATES:
        expected = 16 * whole
    elif bits - whole == 0.5 and whole in _HALF_RATES:
        expected = 16 * whole + 8
    else:
        raise ValueError(f"unsupported bits per weight {bits}: expected 1..8 or a half-integer 1.5..7.5")
    if length != expected:
        raise ValueError(
            f"trellis last dim {length} does not match K={bits} (expected {expected} int16 per tile)"
        )


def check_layer(trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook: str) -> float:
    """Validate one quantized linear and return its K. Raised errors name the offending shape or value.

    The Hadamard blocks need I and O to be multiples of 128 (SPEC 1.3, 4); half-integer rates exist only
    for mul1 (SPEC 2.5).
    """
    _check_codebook(codebook)
    bits = bits_of(trellis)
    if bits != int(bits) and codebook != "mul1":
        raise ValueError(f"half-integer rate K={bits} is only defined for the mul1 codebook, not {codebook}")
    in_features, out_features = TILE * trellis.shape[0], TILE * trellis.shape[1]
    if in_features % HAD_BLOCK or out_features % HAD_BLOCK:
        raise ValueError(
            f"unsupported shape {in_features}x{out_features} (I x O from trellis {tuple(trellis.shape)}): "
            f"both dims must be multiples of {HAD_BLOCK}, the Hadamard block (EXL3 pads layers to it)"
        )
    for name, vec, size in (("suh", suh, in_features), ("svh", svh, out_features)):
        if not isinstance(vec, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(vec).__name__}")
        if not vec.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (fp16 in checkpoints), got {vec.dtype}")
        if tuple(vec.shape) != (size,):
            raise ValueError(
                f"{name} must have shape [{size}] to match trellis {tuple(trellis.shape)}, got {tuple(vec.shape)}"
            )
        if vec.device != trellis.device:
            raise ValueError(f"{name} is on {vec.device} but trellis is on {trellis.device}")
    return bits


def codebook_of(tensors: Mapping[str, torch.Tensor]) -> str:
    """The codebook of one layer, from which marker tensor it carries (SPEC 1.1).

    Keys may be bare (``"mcg"``) or prefixed (``"model.layers.0.mlp.up_proj.mul1"``); every key of the mapping
    is taken to belong to the same layer. No marker means 3INST. Markers with a value other than the fixed
    constant come from pre-release experimental multipliers that no decoder supports, so they are refused, as
    exllamav3 1.6.5 refuses them.
    """
    found: list[str] = []
    for key, value in tensors.items():
        name = key.rsplit(".", 1)[-1]
        if name not in MARKERS:
            continue
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ValueError(f"codebook marker {key!r} must be a scalar tensor")
        stored = int(value.reshape(()).item())
        if stored not in (MARKERS[name], MARKERS[name] & 0xFFFFFFFF):
            raise ValueError(
                f"unknown {name} codebook marker value {stored & 0xFFFFFFFF:#010x} in {key!r}: only "
                f"{MARKERS[name] & 0xFFFFFFFF:#010x} is supported (other multipliers were pre-release experiments)"
            )
        found.append(name)
    if len(set(found)) > 1:
        raise ValueError(
            f"layer carries both codebook markers ({', '.join(sorted(set(found)))}); a layer has at most one"
        )
    return found[0] if found else "3inst"


# ------------------------------------------------------------------------------------------------
# SPEC 2.3: codebook decode, 16-bit state -> fp16 value.
# ------------------------------------------------------------------------------------------------

_MASK32 = 0xFFFFFFFF


def _fp16_from_bits(bits16: torch.Tensor) -> torch.Tensor:
    """Reinterpret integers 0..65535 as fp16 bit patterns."""
    signed = torch.where(bits16 >= 0x8000, bits16 - 0x10000, bits16)
    return signed.to(torch.int16).view(torch.float16)


def _decode_lop3(x: torch.Tensor) -> torch.Tensor:
    """3INST/MCG tail: mask and flip to two fp16 halves in [0.125, 2), then one fp16 add.

    The two halves' exponents differ by at most 3, so their fp32 sum is exact and the single rounding to fp16
    equals the hardware fp16 add (SPEC 2.3, "Numerical exactness").
    """
    x = (x & 0x8FFF8FFF) ^ 0x3B603B60
    lo = _fp16_from_bits(x & 0xFFFF).float()
    hi = _fp16_from_bits(x >> 16).float()
    return (lo + hi).to(torch.float16)


def _decode_mul1(x: torch.Tensor) -> torch.Tensor:
    """mul1 tail: byte sum s, then fma(1024 + s, k_inv, k_bias) rounded once.

    The product (11 x 11 significant bits) and the sum are exact in fp64, so the one rounding to fp16 is the
    fused FMA's. A separate fp16 multiply and add would differ for 822 of the 1021 byte sums (SPEC 2.3).
    """
    s = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + ((x >> 24) & 0xFF)
    k_inv = _fp16_from_bits(torch.tensor(0x1EEE)).double()  # 0.00676727294921875
    k_bias = _fp16_from_bits(torch.tensor(0xC931)).double()  # -10.3828125
    return ((1024 + s).double() * k_inv + k_bias).to(torch.float16)


@cache
def _decode_table_cpu(codebook: str) -> torch.Tensor:
    state = torch.arange(1 << 16, dtype=torch.int64)  # uint32 arithmetic mod 2^32 held in int64
    if codebook == "3inst":
        return _decode_lop3((state * 89226354 + 64248484) & _MASK32)
    if codebook == "mcg":
        return _decode_lop3((state * 0xCBAC1FED) & _MASK32)
    return _decode_mul1((state * 0x83DCD12D) & _MASK32)


@cache
def _decode_table_on(codebook: str, device: torch.device) -> torch.Tensor:
    return _decode_table_cpu(codebook).to(device)


def decode_table(codebook: str, device: torch.device | str | None = None) -> torch.Tensor:
    """fp16 [65536]: the value of every 16-bit trellis state under ``codebook`` (index = state; SPEC 2.3).

    Bit-exact with exllamav3's ``ext.decode``. The returned tensor is cached and shared: do not modify it.
    """
    _check_codebook(codebook)
    return _decode_table_on(codebook, torch.device(device if device is not None else "cpu"))


# ------------------------------------------------------------------------------------------------
# SPEC 2.1, 2.2, 2.5: trellis bitstream -> per-weight 16-bit states.
# ------------------------------------------------------------------------------------------------


@cache
def _window_indices_cpu(bits: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each trellis position j: the two int16 elements holding its 16-bit window, and the window's offset.

    Weight j's window is ring bits [S(j) - 16, S(j)) mod R, where S(j) = (j+1)*K for integer K and
    (j+1)*KA + floor((j+1)/2) for half-integer K (odd positions carry the extra bit), and R = 16 * (int16 per
    tile). Ring bit p is bit 15 - (p & 15) of int16 element (p >> 4) ^ 1 (SPEC 2.1: MSB-first uint32 words whose
    16-bit halves are swapped in the int16 array). A 16-bit window therefore spans at most two consecutive
    16-bit chunks of the ring: chunk a from bit offset o, then the head of chunk a+1.
    """
    j1 = torch.arange(1, TILE_WEIGHTS + 1, dtype=torch.int64)
    whole = math.floor(bits)
    if bits == whole:
        end, length = j1 * whole, 16 * whole
    else:
        end, length = j1 * whole + j1 // 2, 16 * whole + 8
    ring = 16 * length
    start = (end - 16) % ring  # tail-biting: the first windows wrap to the end of the ring
    chunk, offset = start >> 4, start & 15
    first = chunk ^ 1
    second = ((chunk + 1) % length) ^ 1
    return first, second, offset.to(torch.int32)


@cache
def _window_indices_on(bits: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(t.to(device) for t in _window_indices_cpu(bits))  # type: ignore[return-value]


def _states_from_chunks(tiles: torch.Tensor, bits: float, order: torch.Tensor | None) -> torch.Tensor:
    first, second, offset = _window_indices_on(bits, tiles.device)
    if order is not None:
        first, second, offset = first[order], second[order], offset[order]
    u = tiles.to(torch.int32) & 0xFFFF  # uint16 view of the stored int16
    hi = u[..., first]
    lo = u[..., second]
    # ((hi << 16 | lo) >> (16 - o)) & 0xFFFF, kept inside int32: hi << o < 2^31 and lo >> 16 == 0.
    return ((hi << offset) | (lo >> (16 - offset))) & 0xFFFF


def unpack_states(trellis: torch.Tensor, bits: float | None = None) -> torch.Tensor:
    """The full 16-bit state of every weight, in trellis order: int32 [I/16, O/16, 256], values 0..65535.

    Equivalent to exllamav3's ``ext.unpack_trellis`` (which returns the same numbers as int16). ``bits`` defaults
    to :func:`bits_of`; passing it checks that it agrees with the stored tile length. Any bit pattern is a valid
    trellis (SPEC 2.2), so there is nothing else to check.
    """
    _check_trellis(trellis)
    if bits is None:
        bits = bits_of(trellis)
    else:
        _check_bits(bits, int(trellis.shape[-1]))
    return _states_from_chunks(trellis, float(bits), None)


# ------------------------------------------------------------------------------------------------
# SPEC 3: tile grid and the permutation inside a tile.
# ------------------------------------------------------------------------------------------------


@cache
def tile_permutation() -> torch.Tensor:
    """int64 [256]: ``perm[j] = 16*r + c``, the row-major tile position of trellis position j (SPEC 3).

    This is the B-fragment layout of ``mma.m16n8k16``: lane t = j >> 3 holds 8 values e = j & 7 for rows
    {r0, r0+1, r0+8, r0+9} of columns t/4 and t/4 + 8.
    """
    j = torch.arange(TILE_WEIGHTS, dtype=torch.int64)
    t, e = j >> 3, j & 7
    r = 2 * (t & 3) + (e & 1) + 8 * ((e >> 1) & 1)
    c = (t >> 2) + 8 * ((e >> 2) & 1)
    return r * TILE + c


@cache
def _rowmajor_order(device: torch.device) -> torch.Tensor:
    """Inverse of :func:`tile_permutation`: for row-major tile position q, the trellis position j stored there.

    Cached per device, like every other table here, so a warmed-up call makes no host-to-device copies and can
    be captured in a CUDA graph.
    """
    return torch.argsort(tile_permutation()).to(device)


def w_hat(trellis: torch.Tensor, codebook: str) -> torch.Tensor:
    """fp16 [I, O]: the rotated-basis weight decoded from the trellis alone (SPEC 8, first loop).

    Bit-exact with exllamav3's ``ext.reconstruct``. Tile (tk, tn) fills rows 16*tk.. and columns 16*tn..; inside
    the tile, trellis position j goes to row-major position ``tile_permutation()[j]``.
    """
    _check_codebook(codebook)
    bits = bits_of(trellis)
    tiles_k, tiles_n = int(trellis.shape[0]), int(trellis.shape[1])
    table = decode_table(codebook, trellis.device)
    order = _rowmajor_order(trellis.device)
    out = torch.empty(tiles_k, TILE, tiles_n, TILE, dtype=torch.float16, device=trellis.device)
    rows_per_chunk = max(1, _STATES_PER_CHUNK // (tiles_n * TILE_WEIGHTS))
    for k0 in range(0, tiles_k, rows_per_chunk):
        block = trellis[k0 : k0 + rows_per_chunk]
        # States gathered straight into row-major tile order, then looked up in the codebook table.
        states = _states_from_chunks(block, bits, order)
        values = table.index_select(0, states.flatten()).view(block.shape[0], tiles_n, TILE, TILE)
        out[k0 : k0 + rows_per_chunk] = values.permute(0, 2, 1, 3)
    return out.view(tiles_k * TILE, tiles_n * TILE)


# ------------------------------------------------------------------------------------------------
# SPEC 4: Hadamard rotations, scales and the forward equation.
# ------------------------------------------------------------------------------------------------


@cache
def _hadamard_cpu() -> torch.Tensor:
    a = torch.arange(HAD_BLOCK)
    ones = torch.bitwise_and(a[:, None], a[None, :])
    parity = torch.zeros_like(ones)
    for bit in range(7):  # popcount(a & b) mod 2, bit by bit (7 bits for 128)
        parity ^= (ones >> bit) & 1
    return (1.0 - 2.0 * parity.to(torch.float64)) / math.sqrt(HAD_BLOCK)


@cache
def _hadamard_on(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return _hadamard_cpu().to(device=device, dtype=dtype)


def hadamard_128(
    device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """[128, 128]: the natural-order Sylvester Hadamard ``H[a][b] = (-1)^popcount(a & b) / sqrt(128)`` (SPEC 4).

    Symmetric and orthogonal, so it is its own inverse. Cached and shared: do not modify it.
    """
    return _hadamard_on(torch.device(device if device is not None else "cpu"), dtype)


@contextmanager
def _ieee_fp32() -> Iterator[None]:
    """Run fp32 matmuls at full precision whatever the process-wide setting is.

    ``torch.set_float32_matmul_precision("high"/"medium")`` (which serving stacks set for speed) lets fp32
    matmuls run in TF32 or bf16, with relative errors of ~1e-3: enough to make an oracle disagree with the kernels
    it judges. The setting is process-wide, so it is restored on exit.
    """
    saved = torch.get_float32_matmul_precision()
    if saved == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


def _had_first(w: torch.Tensor) -> torch.Tensor:
    """Multiply a 2-D matrix by blockdiag(H128) from the left: each 128-row block of w becomes H128 . block.

    Written as a batched product on a view (no transposed copies), which is ~100x faster on a busy 2-core CPU.
    """
    h = hadamard_128(w.device, w.dtype)
    return (h @ w.reshape(w.shape[0] // HAD_BLOCK, HAD_BLOCK, w.shape[1])).reshape(w.shape)


def _had_last(x: torch.Tensor) -> torch.Tensor:
    """Multiply every 128-chunk of the last dim by H128 (block-diagonal Hadamard from the right)."""
    n = x.shape[-1]
    h = hadamard_128(x.device, x.dtype)
    return (x.reshape(*x.shape[:-1], n // HAD_BLOCK, HAD_BLOCK) @ h).reshape(x.shape)


def had_r_128(
    x: torch.Tensor,
    pre_scale: torch.Tensor | None = None,
    post_scale: torch.Tensor | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """``((x * pre) . blockdiag(H128) * scale) * post`` on the last dim, in fp32, returned in x's dtype.

    The reference for the input side (``pre_scale = suh``) and output side (``post_scale = svh``) of the forward
    pass, as exllamav3's ``had_r_128`` (SPEC 6) computes them; kernels that run the rotations as side kernels
    check against it.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError("had_r_128 needs a floating-point tensor")
    if x.dim() == 0 or x.shape[-1] % HAD_BLOCK:
        raise ValueError(f"had_r_128: last dim must be a multiple of {HAD_BLOCK}, got shape {tuple(x.shape)}")
    y = x.float()
    if pre_scale is not None:
        y = y * pre_scale.float()
    with _ieee_fp32():
        y = _had_last(y)
    if scale != 1.0:
        y = y * scale
    if post_scale is not None:
        y = y * post_scale.float()
    return y.to(x.dtype)


def weight(trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook: str) -> torch.Tensor:
    """fp16 [I, O]: the dense weight in the original basis, ``diag(suh) . Hk . W_hat . Hn . diag(svh)`` (SPEC 4).

    This is W with y = x . W; the Hugging Face ``nn.Linear.weight`` is its transpose. Computed in fp32 and rounded
    once, so it is closer to exact than exllamav3's fused fp16 reconstruct (hence the 1e-3 tolerance).
    """
    check_layer(trellis, suh, svh, codebook)
    w = w_hat(trellis, codebook).float()
    with _ieee_fp32():
        w = _had_first(w)  # Hk . W_hat
        w = _had_last(w)  # . Hn
    w = w * suh.float()[:, None] * svh.float()[None, :]
    return w.to(torch.float16)


def matmul(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: str,
    *,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = x . W (+ bias)`` for x [..., I], in the factored form the kernels compute (SPEC 4, "Forward"):

        x' = (x * suh) . Hk ;  z = x' . W_hat ;  y = (z . Hn) * svh

    fp32 throughout, result in x's dtype. x must already be zero-padded to the layer's padded I (SPEC 1.3).
    """
    check_layer(trellis, suh, svh, codebook)
    in_features = TILE * int(trellis.shape[0])
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(
            f"x must be a floating-point tensor, got {type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}"
        )
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(
            f"x must have shape [..., {in_features}] to match trellis {tuple(trellis.shape)}, got {tuple(x.shape)}"
        )
    if x.device != trellis.device:
        raise ValueError(f"x is on {x.device} but trellis is on {trellis.device}")
    w = w_hat(trellis, codebook).float()
    with _ieee_fp32():
        xr = _had_last(x.float() * suh.float())
        z = xr @ w
        y = _had_last(z) * svh.float()
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (svh.shape[0],):
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"bias must have shape [{svh.shape[0]}] (the layer's padded O), got {shape}")
        y = y + bias.float()
    return y.to(x.dtype)


def matmul_gathered(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    bits: Sequence[float],
    codebooks: Sequence[str],
    index: torch.Tensor,
) -> torch.Tensor:
    """Row p of ``x [P, I]`` times expert ``index[p]``'s W: ``y [P, O]``, each row exactly :func:`matmul` with that
    expert, in x's dtype.

    The experts of one layer are stacked: ``trellis`` int16 ``[E, I/16, O/16, Lmax]`` (expert e's tiles in its first
    16*K_e elements, the rest padding), ``suh [E, I]``, ``svh [E, O]``, ``bits[e]`` and ``codebooks[e]`` per expert,
    so experts may differ in K and codebook. Why: a MoE layer must decode only the experts its tokens were routed
    to, and must find them by tensor indexing (``index`` is never read on the host), so the shapes do not depend on
    the routing and nothing waits for it. Duplicate indices decode that expert once per row.
    """
    if trellis.dim() != 4 or trellis.dtype != torch.int16:
        raise ValueError(
            f"trellis must be an int16 [E, I/16, O/16, L] stack, got {tuple(trellis.shape)} {trellis.dtype}"
        )
    experts, tiles_k, tiles_n, length = (int(n) for n in trellis.shape)
    in_features, out_features = TILE * tiles_k, TILE * tiles_n
    if len(bits) != experts or len(codebooks) != experts:
        raise ValueError(f"{experts} stacked experts but {len(bits)} rates and {len(codebooks)} codebooks")
    if tuple(suh.shape) != (experts, in_features) or tuple(svh.shape) != (experts, out_features):
        raise ValueError(
            f"suh and svh must be [{experts}, {in_features}] and [{experts}, {out_features}], "
            f"got {tuple(suh.shape)} and {tuple(svh.shape)}"
        )
    for b, cb in zip(bits, codebooks, strict=True):
        _check_codebook(cb)
        _check_bits(float(b), int(round(16 * float(b))))
        if float(b) != int(b) and cb != "mul1":
            raise ValueError(f"half-integer rate {b} needs the mul1 codebook, got {cb!r}")
        if int(round(16 * float(b))) > length:
            raise ValueError(
                f"a {b}-bit expert needs {int(round(16 * float(b)))} int16 per tile, the stack has {length}"
            )
    if x.dim() != 2 or x.shape[-1] != in_features or index.dim() != 1 or index.shape[0] != x.shape[0]:
        raise ValueError(
            f"x must be [P, {in_features}] and index [P], got {tuple(x.shape)} and {tuple(index.shape)}"
        )
    dev = trellis.device
    order = _rowmajor_order(dev)
    windows = [_window_indices_on(float(b), dev) for b in bits]  # per expert, in row-major tile order
    first = torch.stack([w[0][order] for w in windows])
    second = torch.stack([w[1][order] for w in windows])
    offset = torch.stack([w[2][order] for w in windows])
    tables = torch.cat([decode_table(cb, dev) for cb in CODEBOOKS])  # [3 * 65536]
    table_base = torch.tensor([CODEBOOKS.index(cb) << 16 for cb in codebooks], dtype=torch.int32, device=dev)
    index = index.to(device=dev, dtype=torch.int64)
    rows = int(x.shape[0])
    out = torch.empty(rows, out_features, dtype=torch.float32, device=dev)
    per_chunk = max(1, _STATES_PER_CHUNK // (tiles_k * tiles_n * TILE_WEIGHTS))  # experts decoded at once
    for p0 in range(0, rows, per_chunk):
        idx = index[p0 : p0 + per_chunk]
        n = int(idx.shape[0])
        u = trellis.index_select(0, idx).to(torch.int32) & 0xFFFF  # [n, tk, tn, L] uint16 view
        shape = (n, tiles_k, tiles_n, TILE_WEIGHTS)
        hi = torch.gather(u, 3, first.index_select(0, idx)[:, None, None, :].expand(shape))
        lo = torch.gather(u, 3, second.index_select(0, idx)[:, None, None, :].expand(shape))
        off = offset.index_select(0, idx)[:, None, None, :]
        states = ((hi << off) | (lo >> (16 - off))) & 0xFFFF
        states = states + table_base.index_select(0, idx)[:, None, None, None]
        values = tables.index_select(0, states.flatten()).view(n, tiles_k, tiles_n, TILE, TILE)
        w = values.permute(0, 1, 3, 2, 4).reshape(n, in_features, out_features).float()
        with _ieee_fp32():
            xr = _had_last(x[p0 : p0 + n].float() * suh.index_select(0, idx).float())
            z = torch.bmm(xr[:, None, :], w)[:, 0, :]
            out[p0 : p0 + n] = _had_last(z) * svh.index_select(0, idx).float()
    return out.to(x.dtype)
