"""The rates the EXL3 kernels are compiled for, read from the one list the C++ compiles (``EXL3_RATES`` in
``kernels/csrc/exl3_common.cuh``).

Why parse the header: the benches used to carry their own copies of the rate list, which drifted from the kernels'
when a rate was added or dropped. Reading the macro the kernels are instantiated from needs no GPU and no built
extension (the benches' CPU tests import them), and a header the parser cannot read is an error, never an empty or
partial list.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

HEADER = Path(__file__).resolve().parents[1] / "csrc" / "exl3_common.cuh"
CODEBOOKS = ("3inst", "mcg", "mul1")  # codebook id = index, as the kernels number them

_DEFINE = re.compile(r"#define\s+EXL3_RATES\(X\)(?P<body>(?:[^\n]*\\\n)*[^\n]*)")
_ENTRY = re.compile(r"X\(\s*(?P<k2>\d+)\s*,\s*(?P<all>[01])\s*\)")


@cache
def compiled_rates(header: Path = HEADER) -> tuple[tuple[int, bool], ...]:
    """(k2, all codebooks) per compiled rate, in the header's order: k2 = twice the bits per weight; False means the
    rate is compiled with mul1 only (the half-integer rates)."""
    match = _DEFINE.search(header.read_text())
    if match is None:
        raise ValueError(f"{header}: no '#define EXL3_RATES(X)' found")
    body = match["body"].replace("\\\n", " ")
    entries = [(int(m["k2"]), m["all"] == "1") for m in _ENTRY.finditer(body)]
    leftover = _ENTRY.sub("", body).strip()
    if not entries or leftover:
        raise ValueError(f"{header}: EXL3_RATES must be X(k2, 0 or 1) entries only, found {body.strip()!r}")
    return tuple(entries)


def rates_k2() -> tuple[int, ...]:
    """Every compiled k2, in the header's order."""
    return tuple(k2 for k2, _ in compiled_rates())


def codebooks(k2: int) -> tuple[str, ...]:
    """The codebooks rate k2 is compiled with (none when it is not compiled)."""
    for rate, every in compiled_rates():
        if rate == k2:
            return CODEBOOKS if every else ("mul1",)
    return ()


def pairs() -> tuple[tuple[int, str], ...]:
    """Every compiled (k2, codebook), rate by rate in the header's order."""
    return tuple((k2, cb) for k2 in rates_k2() for cb in codebooks(k2))
