"""Reads safetensors shards tensor by tensor, counting every byte it reads.

Why not `safetensors.safe_open`: it memory-maps the file, so nothing can tell how much of a 91 GiB pack a check
really touched, and `verify --quick` promises to read only a sampled few GiB. Plain `seek` + `read` of one
tensor's byte range is just as fast for the few tensors a check wants, and the count is exact.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

#: safetensors dtype names -> torch dtypes (the ones EXL3 packs hold)
DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}

#: The largest header a real shard has is a few MiB; anything past this is a corrupt length field.
_MAX_HEADER = 100 * 1024 * 1024


class PackFileError(ValueError):
    """A shard that cannot be read as safetensors (truncated, a corrupt header, a tensor past its end)."""


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class Shard:
    path: Path
    size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    header_bytes: int = 0


def read_header(path: Path) -> Shard:
    """One shard's tensors (name, dtype, shape, byte range) from its header; PackFileError when it is corrupt."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise PackFileError(f"{path.name}: shorter than the 8-byte safetensors header length")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise PackFileError(f"{path.name}: header length {n} does not fit the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PackFileError(f"{path.name}: corrupt safetensors header ({exc})") from None
    base = 8 + n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            lo, hi = (int(v) for v in entry["data_offsets"])
            info = TensorInfo(
                path, str(entry["dtype"]), tuple(int(d) for d in entry["shape"]), base + lo, base + hi
            )
        except (KeyError, TypeError, ValueError):
            raise PackFileError(f"{path.name}: tensor {name} has a malformed header entry") from None
        if info.end > size:
            raise PackFileError(f"{path.name}: tensor {name} ends at byte {info.end}, past the file's {size}")
        tensors[name] = info
    meta = header.get("__metadata__") or {}
    return Shard(path, size, tensors, {str(k): str(v) for k, v in meta.items()}, base)


@dataclass
class PackReader:
    """Tensors of a pack by name, read on demand; `bytes_read` counts what was read (headers included)."""

    shards: dict[str, Shard] = field(default_factory=dict)  # file name -> shard
    where: dict[str, TensorInfo] = field(default_factory=dict)  # tensor name -> its info
    bytes_read: int = 0
    digests: dict[str, str] = field(default_factory=dict)  # tensor name -> blake2b of its bytes, as read

    def add(self, shard: Shard) -> None:
        self.shards[shard.path.name] = shard
        self.bytes_read += shard.header_bytes
        for name, info in shard.tensors.items():
            self.where.setdefault(name, info)

    def raw(self, name: str) -> bytes:
        info = self.where[name]
        with open(info.file, "rb") as f:
            f.seek(info.start)
            data = f.read(info.nbytes)
        if len(data) != info.nbytes:
            raise PackFileError(
                f"{info.file.name}: tensor {name} is cut short ({len(data)} of {info.nbytes} bytes)"
            )
        self.bytes_read += len(data)
        self.digests[name] = hashlib.blake2b(data, digest_size=16).hexdigest()
        return data

    def tensor(self, name: str) -> torch.Tensor:
        info = self.where[name]
        dtype = DTYPES.get(info.dtype)
        if dtype is None:
            raise PackFileError(
                f"{info.file.name}: tensor {name} has dtype {info.dtype}, which no EXL3 pack uses"
            )
        data = self.raw(name)
        if not data:
            return torch.empty(info.shape, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=dtype).reshape(info.shape)
