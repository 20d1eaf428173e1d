"""Torch-free facts about an EXL3 checkpoint: which modules are EXL3, and where tensor-parallel cuts go.

Kept free of torch and vLLM so the rules can be tested in milliseconds and reused by tools that only
look at files. The checkpoint does not describe itself (SPEC 1.1, notes section 8): only the tensor names
say whether a module is EXL3 (``.trellis`` + ``.suh`` + ``.svh``) or plain (``.weight``), so we read
the safetensors headers, which is a few kilobytes per shard and no tensor data.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

#: Hadamard block: EXL3 layers can only be cut at multiples of it (SPEC 4; notes section 3).
CUT = 128

EXL3_TENSORS = ("trellis", "suh", "svh")
MARKER_TENSORS = ("mcg", "mul1")
#: Legacy names the SPEC mentions (1.1) that we do not load: packed sign bits and a rejected scale.
LEGACY_TENSORS = ("su", "sv", "scale")


class ShardCutError(ValueError):
    """A tensor-parallel cut that does not fall on a 128 boundary: the layer cannot be split correctly."""


@dataclass
class CheckpointIndex:
    """Module prefixes of a checkpoint by how they are stored."""

    exl3: set[str] = field(default_factory=set)
    plain: set[str] = field(default_factory=set)
    legacy: set[str] = field(default_factory=set)
    #: embeddings in exllamav3 1.6.5's row codec (``--embed_bits``: ``.trellis`` + ``.signs``, SPEC 1.5)
    row_codec: set[str] = field(default_factory=set)
    #: n-gram (PLE) tables in exllamav3's ``exl3_ngram_trellis`` codec, by module prefix (not EXL3 linears)
    ngram: dict[str, NgramTableInfo] = field(default_factory=dict)
    files: int = 0


@dataclass(frozen=True)
class NgramTableInfo:
    """What the plugin must allocate for a packed n-gram table, from the safetensors headers alone."""

    shard_rows: tuple[
        int, ...
    ]  # rows of each ``<prefix>.shard_<n>.trellis`` (or the single ``<prefix>.trellis``)
    words: int  # int16 words per row: the fp16 scale, then the ring's bit stream
    heads: int  # entries of ``<prefix>.head_offsets``
    dim: int  # positions per row (``<prefix>.head_bias`` is [heads, dim])
    sharded: bool = True  # ``shard_<n>.trellis`` tensors, else one ``<prefix>.trellis``

    @property
    def rows(self) -> int:
        return sum(self.shard_rows)


def read_safetensors_names(path: Path) -> list[str]:
    """Tensor names in one .safetensors file, from its JSON header (8-byte little-endian length first)."""
    return list(read_safetensors_shapes(path))


def read_safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape of one .safetensors file, from its JSON header alone."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (size,) = struct.unpack("<Q", head)
        if size > 100 * 1024 * 1024:
            raise ValueError(
                f"{path}: safetensors header of {size} bytes is implausible; is the file corrupt?"
            )
        header = json.loads(f.read(size))
    return {k: list(v.get("shape", [])) for k, v in header.items() if k != "__metadata__"}


def scan_checkpoint(model_dir: Path) -> CheckpointIndex:
    """Classify every module of a local model directory by the tensors it stores.

    A group holding ``head_offsets`` is an n-gram (PLE) table, and its ``<prefix>.shard_<n>`` groups (a
    ``trellis`` each) are that table's row shards, not EXL3 linears (which also store a ``trellis``).
    """
    index = CheckpointIndex()
    groups: dict[str, set[str]] = {}
    shapes: dict[str, list[int]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        index.files += 1
        for name, shape in read_safetensors_shapes(path).items():
            prefix, _, leaf = name.rpartition(".")
            groups.setdefault(prefix, set()).add(leaf)
            shapes[name] = shape
    tables = {p for p, leaves in groups.items() if "head_offsets" in leaves}
    for prefix in tables:
        index.ngram[prefix] = _ngram_info(prefix, groups, shapes)
    for prefix, leaves in groups.items():
        if prefix in tables or _shard_of_table(prefix) in tables:
            continue
        if "trellis" in leaves and "signs" in leaves:
            index.row_codec.add(prefix)
        elif "trellis" in leaves:
            index.exl3.add(prefix)
        elif "weight" in leaves:
            index.plain.add(prefix)
        elif leaves & {"su", "sv"}:
            index.legacy.add(prefix)
    return index


def _shard_of_table(prefix: str) -> str | None:
    """``a.b.shard_3`` -> ``a.b`` (the table a row shard belongs to), else None."""
    parent, _, last = prefix.rpartition(".")
    return parent if last.startswith("shard_") and last[6:].isdigit() else None


def _ngram_info(prefix: str, groups: dict[str, set[str]], shapes: dict[str, list[int]]) -> NgramTableInfo:
    names: list[str] = []
    while f"{prefix}.shard_{len(names)}" in groups:
        names.append(f"{prefix}.shard_{len(names)}.trellis")
    if not names and "trellis" in groups[prefix]:
        names = [f"{prefix}.trellis"]
    missing = [n for n in ("head_bias", "head_offsets") if n not in groups[prefix]]
    if not names or missing:
        what = ", ".join(
            [f"{prefix}.{n}" for n in missing] + ([] if names else [f"{prefix}.shard_0.trellis"])
        )
        raise ValueError(f"{prefix}: incomplete n-gram (PLE) table in the checkpoint: no {what}")
    dims = [shapes[n] for n in names]
    if any(len(d) != 2 for d in dims) or len({d[1] for d in dims}) != 1:
        raise ValueError(f"{prefix}: n-gram table shards must be 2-D [rows, words] of one width, got {dims}")
    bias = shapes[f"{prefix}.head_bias"]
    offsets = shapes[f"{prefix}.head_offsets"]
    if len(bias) != 2 or len(offsets) != 1 or bias[0] != offsets[0]:
        raise ValueError(
            f"{prefix}: n-gram head_bias {bias} and head_offsets {offsets} do not describe the same heads"
        )
    return NgramTableInfo(tuple(d[0] for d in dims), dims[0][1], offsets[0], bias[1], ".shard_" in names[0])


def column_cut(layer: str, stored_out: int, part: int, rank: int, tp_size: int) -> tuple[int, int]:
    """(start, width) of this rank's output columns of one shard; width may be short on a padded last rank.

    Column-parallel layers split the output dim: the trellis along dim 1 (16 columns per tile) and svh; suh
    is replicated. With ``tp_size == 1`` the whole stored (padded) tensor is kept.
    """
    if tp_size == 1:
        return 0, stored_out
    start = _on_blocks(layer, "output column", part, rank, tp_size)
    if start >= stored_out:
        raise ShardCutError(
            f"{layer}: rank {rank} starts at column {start}, past the stored width {stored_out}"
        )
    return start, min(part, stored_out - start)


def row_cut(layer: str, stored_in: int, part: int, rank: int, tp_size: int) -> tuple[int, int]:
    """(start, width) of this rank's input rows: the trellis along dim 0 and suh; svh is replicated."""
    if tp_size == 1:
        return 0, stored_in
    start = _on_blocks(layer, "input row", part, rank, tp_size)
    if start + part > stored_in:
        raise ShardCutError(
            f"{layer}: rank {rank} needs input rows up to {start + part}, stored only {stored_in}"
        )
    return start, part


def _on_blocks(layer: str, axis: str, part: int, rank: int, tp_size: int) -> int:
    """Where this rank's cut starts, refused unless it and the partition width fall on Hadamard blocks."""
    start = rank * part
    if start % CUT or part % CUT:
        raise ShardCutError(
            f"{layer}: tensor-parallel cut at {axis} {start} (partition width {part}, rank {rank} of "
            f"{tp_size}) is not a multiple of {CUT}; EXL3 layers can only be split on their {CUT}-wide "
            f"Hadamard blocks. Use a tensor-parallel size that divides this layer into multiples of {CUT}."
        )
    return start
