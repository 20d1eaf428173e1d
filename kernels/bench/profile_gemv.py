"""Run one EXL3 GEMV shape (or, with ``--op weight``, the prefill's reconstruction of W) a few times so Nsight
Compute can profile a single launch of it.

For the device machine (kernels/PERF.md has the exact invocations):

    ncu --clock-control none --set full -k regex:gemv --launch-skip 4 --launch-count 1 \
        python3 kernels/bench/profile_gemv.py --shape 4096x14336 --bits 2 --codebook mul1 --rows 1
    ncu --clock-control none --set full -k regex:recon --launch-skip 4 --launch-count 1 \
        python3 kernels/bench/profile_gemv.py --op weight

Random weights and inputs (never zeros: METHOD.md), fresh per launch so the trellis is read from HBM as in a
real decode step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkctl_exl3 import cuda, reference  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="4096x14336", help="IxO")
    p.add_argument("--bits", type=float, default=2)
    p.add_argument("--codebook", default="mul1", choices=reference.CODEBOOKS)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--launches", type=int, default=6)
    p.add_argument(
        "--op", choices=("gemv", "weight"), default="gemv", help="weight: the prefill's reconstruction"
    )
    args = p.parse_args(argv)
    if not cuda.available():
        print(f"error: {cuda.unavailable_reason()}", file=sys.stderr)
        return 1
    in_f, out_f = (int(v) for v in args.shape.split("x"))
    k2 = int(round(2 * args.bits))
    gen = torch.Generator().manual_seed(7)
    sets = []
    for _ in range(args.launches):
        t = torch.randint(-32768, 32768, (in_f // 16, out_f // 16, 8 * k2), generator=gen, dtype=torch.int32)
        suh = (torch.randn(in_f, generator=gen) * 0.05).half()
        svh = (torch.randn(out_f, generator=gen) * 0.05).half()
        x = torch.randn(args.rows, in_f, generator=gen).half()
        sets.append([v.cuda() for v in (x, t.to(torch.int16), suh, svh)])
    cb = reference.CODEBOOKS.index(args.codebook)
    for x, t, suh, svh in sets:
        if args.op == "weight":
            cuda.weight(t, suh, svh, cb)
        else:
            cuda.gemv(x, t, suh, svh, cb)
    torch.cuda.synchronize()
    print(
        f"ran {args.launches} {args.op} launches of {args.shape} K={args.bits} {args.codebook} rows={args.rows}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
