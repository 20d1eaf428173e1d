"""Safetensors headers, read without touching tensor data: what a pack holds, in a few KB per file.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming every
tensor's dtype, shape and byte range. Everything the prepare stage decides (which files hold tensors,
which modules are EXL3, how big the n-gram table is) comes from these headers, so preparing an 80 GB
pack reads kilobytes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl.errors import RuntimeFailure

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit; larger means a corrupt file


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Header:
    """One file's tensors and `__metadata__`; `data_bytes` is what the tensors occupy after the header."""

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def read_header(path: Path) -> Header:
    """Parse one file's header; a truncated or foreign file is a RuntimeFailure naming it."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError("shorter than the 8-byte header length")
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"header length {size} is implausible")
            raw = f.read(size)
            if len(raw) != size:
                raise ValueError("truncated header")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("header is not a JSON object")
        tensors: dict[str, TensorInfo] = {}
        for name, info in data.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            tensors[name] = TensorInfo(str(info["dtype"]), tuple(int(s) for s in info["shape"]), end - start)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeFailure(
            f"{path}: not a readable safetensors file ({exc})",
            hint="the download may be incomplete: run `sparkctl up` again without --offline to resume it",
        ) from exc
    meta = data.get("__metadata__") or {}
    return Header(path=Path(path), tensors=tensors, metadata={str(k): str(v) for k, v in meta.items()})


def read_headers(model_dir: Path) -> list[Header]:
    """Every top-level *.safetensors file of a model directory, in name order (the loaders' order)."""
    return [read_header(p) for p in sorted(Path(model_dir).glob("*.safetensors"))]
