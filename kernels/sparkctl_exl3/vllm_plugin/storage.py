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
    files: int = 0


def read_safetensors_names(path: Path) -> list[str]:
    """Tensor names in one .safetensors file, from its JSON header (8-byte little-endian length first)."""
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
    return [k for k in header if k != "__metadata__"]


def scan_checkpoint(model_dir: Path) -> CheckpointIndex:
    """Classify every module of a local model directory by the tensors it stores."""
    index = CheckpointIndex()
    groups: dict[str, set[str]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        index.files += 1
        for name in read_safetensors_names(path):
            prefix, _, leaf = name.rpartition(".")
            groups.setdefault(prefix, set()).add(leaf)
    for prefix, leaves in groups.items():
        if "trellis" in leaves and "signs" in leaves:
            index.row_codec.add(prefix)
        elif "trellis" in leaves:
            index.exl3.add(prefix)
        elif "weight" in leaves:
            index.plain.add(prefix)
        elif leaves & {"su", "sv"}:
            index.legacy.add(prefix)
    return index


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
