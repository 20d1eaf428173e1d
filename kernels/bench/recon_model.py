"""A lane-by-lane Python model of kernels/csrc/exl3_recon.cu, checked against ``reference.weight`` on the CPU.

Why: the kernel's bit positions, mma fragment layouts (PTX ISA, m16n8k16 .f16), sign folding and shared-memory
exchange can only run on a GPU; transcribing them index for index here lets a CPU machine catch a wrong layout
before any device time is spent (the GEMV's state extraction was cross-checked the same way). It models the
arithmetic too (fp16 decode, fp32 accumulation, the fp16 hi/lo split, one final rounding), so the agreement it
reports is the one the kernel should reach. ``tests/kernels/test_recon_model.py`` runs it for every rate.

    PYTHONPATH=kernels python kernels/bench/recon_model.py
"""

from __future__ import annotations

import torch
from sparkctl_exl3 import reference

LANES = torch.arange(32)
G, C = LANES >> 2, LANES & 3


def _width(k2: int, j: int) -> int:
    return k2 // 2 + (j & 1) if k2 & 1 else k2 // 2


def _end(k2: int, e: int) -> int:
    return sum(_width(k2, i) for i in range(e + 1))


def _h16(r: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """H16[r][k] = (-1)^popcount(r & k), unnormalised."""
    x = r & k
    parity = torch.zeros_like(x)
    for b in range(4):
        parity ^= (x >> b) & 1
    return 1.0 - 2.0 * parity.double()


def _bits16(words: list[int], off: int) -> int:
    """bits16<OFF>: one shift, or one funnel shift across two words."""
    q, r = off // 32, off % 32
    if r + 16 <= 32:
        return (words[q] >> (16 - r)) & 0xFFFF
    return _funnel_l(words[q + 1], words[q], r) >> 16


def _funnel_l(lo: int, hi: int, shift: int) -> int:
    """__funnelshift_l(lo, hi, shift): the high 32 bits of (hi:lo) << (shift & 31)."""
    return (((hi << 32) | lo) << (shift & 31) >> 32) & 0xFFFFFFFF


def _states(tile_words: list[int], k2: int) -> torch.Tensor:
    """[32 lanes, 8] states exactly as the kernel cuts them from one tile's 32-bit words: the lane's raw words
    (wrapping around the ring), funnel-shifted so its first window starts at bit 0, then compile-time cuts."""
    ring, nw = 128 * k2, 4 * k2
    off = [_end(k2, e) - _end(k2, 0) for e in range(8)]
    norm_words = (off[7] + 16 + 31) // 32
    out = torch.zeros(32, 8, dtype=torch.int64)
    for lane in range(32):
        b0 = 4 * k2 * lane + _end(k2, 0) - 16
        b0 = b0 + ring if b0 < 0 else b0
        first_bit = b0 & 31
        word_at = [
            (b0 >> 5) + i - nw if (b0 >> 5) + i >= nw else (b0 >> 5) + i for i in range(norm_words + 1)
        ]
        raw = [tile_words[q] for q in word_at]
        norm = [_funnel_l(raw[i + 1], raw[i], first_bit) for i in range(norm_words)]
        for e in range(8):
            out[lane, e] = _bits16(norm, off[e])
    return out


def _mma(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """C += A . B for fragments given as dense matrices (A 16x16, B 16x8 fp16 values; fp32 accumulation)."""
    return (acc.float() + a.half().float() @ b.half().float()).float()


def _a_from_lanes(regs: list[torch.Tensor]) -> torch.Tensor:
    """A 16x16 from per-lane registers [reg][lane] -> (lo, hi) pairs (PTX m16n8k16 A layout)."""
    a = torch.zeros(16, 16, dtype=torch.float64)
    for reg, (dr, dk) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
        lo, hi = regs[reg]
        a[G + dr, 2 * C + dk] = lo.double()
        a[G + dr, 2 * C + dk + 1] = hi.double()
    return a


def _b_from_lanes(
    reg0: tuple[torch.Tensor, torch.Tensor], reg1: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """B 16x8 from per-lane registers (PTX layout: reg0 = k 2c, 2c+1; reg1 = k 2c+8, 2c+9; column g)."""
    b = torch.zeros(16, 8, dtype=torch.float64)
    b[2 * C, G], b[2 * C + 1, G] = reg0
    b[2 * C + 8, G], b[2 * C + 9, G] = reg1
    return b


def _c_to_lanes(cmat: torch.Tensor) -> torch.Tensor:
    """[lane, 4]: c0, c1 = (g, 2c..2c+1), c2, c3 = (g+8, 2c..2c+1)."""
    return torch.stack([cmat[G, 2 * C], cmat[G, 2 * C + 1], cmat[G + 8, 2 * C], cmat[G + 8, 2 * C + 1]], 1)


def _lanes_to_c(v: torch.Tensor) -> torch.Tensor:
    cmat = torch.zeros(16, 8, dtype=torch.float32)
    cmat[G, 2 * C], cmat[G, 2 * C + 1], cmat[G + 8, 2 * C], cmat[G + 8, 2 * C + 1] = v.unbind(1)
    return cmat


def _decode(states: torch.Tensor, codebook: str) -> torch.Tensor:
    return reference.decode_table(codebook)[states].double()


def model_block(trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook: str, kb: int, nb: int):
    """The kernel's computation of one 128x128 block (kb, nb) of W, as fp16 [128, 128]."""
    k2 = trellis.shape[-1] // 8
    u16 = trellis.to(torch.int64) & 0xFFFF
    ha = [
        (_h16(G, 2 * C), _h16(G, 2 * C + 1)),
        (_h16(G + 8, 2 * C), _h16(G + 8, 2 * C + 1)),
        (_h16(G, 2 * C + 8), _h16(G, 2 * C + 9)),
        (_h16(G + 8, 2 * C + 8), _h16(G + 8, 2 * C + 9)),
    ]
    a_h16 = _a_from_lanes(ha)
    xbuf_all = torch.zeros(128, 128, dtype=torch.float32)  # the exchange buffer of every round, stacked
    for warp in range(8):
        bf = []  # per a: (b00, b01, b10, b11) as pairs of per-lane values
        for a in range(8):
            tile = u16[8 * kb + a, 8 * nb + warp]
            words = [int(tile[2 * q] | (tile[2 * q + 1] << 16)) for q in range(4 * k2)]
            v = _decode(_states(words, k2), codebook)  # [lane, e]
            bf.append([(v[:, 2 * i], v[:, 2 * i + 1]) for i in range(4)])
        for rnd in range(4):
            eo = torch.zeros(2, 2, 32, 4, dtype=torch.float32)
            for par in range(2):
                for h in range(2):
                    acc = torch.zeros(16, 8, dtype=torch.float32)
                    for a in range(par, 8, 2):
                        neg = bin((2 * rnd) & a).count("1") & 1
                        acc = _mma(
                            -a_h16 if neg else a_h16, _b_from_lanes(bf[a][2 * h], bf[a][2 * h + 1]), acc
                        )
                    eo[par, h] = _c_to_lanes(acc)
            for s in range(2):
                t = eo[0] - eo[1] if s else eo[0] + eo[1]  # [h, lane, 4]
                hi = t.half()
                lo = (t - hi.float()).half()
                a_hi = _a_from_lanes(
                    [
                        (hi[0, :, 0], hi[0, :, 1]),
                        (hi[0, :, 2], hi[0, :, 3]),
                        (hi[1, :, 0], hi[1, :, 1]),
                        (hi[1, :, 2], hi[1, :, 3]),
                    ]
                )
                a_lo = _a_from_lanes(
                    [
                        (lo[0, :, 0], lo[0, :, 1]),
                        (lo[0, :, 2], lo[0, :, 3]),
                        (lo[1, :, 0], lo[1, :, 1]),
                        (lo[1, :, 2], lo[1, :, 3]),
                    ]
                )
                for h in range(2):
                    bmat = _b_from_lanes(ha[h], ha[h + 2])
                    u = _mma(a_lo, bmat, _mma(a_hi, bmat, torch.zeros(16, 8)))
                    rows = 32 * rnd + 16 * s
                    for r in range(16):  # the XOR swizzle: halves swapped in rows with bit 1 of (row & 7) set
                        col = 16 * warp + ((8 * h) ^ (((r & 7) >> 1 & 1) * 8))
                        xbuf_all[rows + r, col : col + 8] = u[r]
    out = torch.zeros(128, 128, dtype=torch.float16)
    for rnd in range(4):
        for tid in range(256):
            xrow, xcol = tid >> 3, (tid & 7) * 2
            xsw = xcol ^ (((xrow >> 1) & 1) * 8)
            v = torch.stack([xbuf_all[32 * rnd + xrow, 16 * w + xsw : 16 * w + xsw + 2] for w in range(8)])
            for sstep in (1, 2, 4):  # fwht8, natural order
                for i in range(8):
                    if i & sstep:
                        continue
                    x, y = v[i].clone(), v[i + sstep].clone()
                    v[i], v[i + sstep] = x + y, x - y
            k = kb * 128 + 32 * rnd + xrow
            scale = suh[k].float() * (1.0 / 128.0)
            for w in range(8):
                n = nb * 128 + 16 * w + xcol
                out[32 * rnd + xrow, 16 * w + xcol : 16 * w + xcol + 2] = (
                    v[w] * scale * svh[n : n + 2].float()
                ).half()
    return out


def check(k2: int, codebook: str, seed: int = 0) -> tuple[float, float]:
    """(relative error of the modelled W against reference.weight, fraction of fp16 bits that differ)."""
    gen = torch.Generator().manual_seed(seed)
    trellis = torch.randint(-32768, 32768, (16, 8, 8 * k2), dtype=torch.int16, generator=gen)  # 256 x 128
    suh = (torch.randn(256, generator=gen) * 0.05).half()
    svh = (torch.randn(128, generator=gen) * 0.05).half()
    ref = reference.weight(trellis, suh, svh, codebook)
    got = torch.cat([model_block(trellis, suh, svh, codebook, kb, 0) for kb in range(2)])
    rel = float((got.float() - ref.float()).norm() / ref.float().norm())
    return rel, float((got.view(torch.int16) != ref.view(torch.int16)).float().mean())


if __name__ == "__main__":
    for k2, cb in [(4, "mul1"), (8, "3inst"), (5, "mul1"), (2, "mcg"), (16, "mcg"), (3, "mul1"), (7, "mul1")]:
        rel, diff = check(k2, cb)
        print(f"K={k2 / 2:g} {cb}: rel {rel:.2e}, bits differing {diff:.4%}")
