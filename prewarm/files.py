"""Which files make up a model, in the order its loader reads them, and whether they are whole.

Order matters: workers take byte ranges from one queue filled in loader order, so the shards a
loader opens first are warm first and a server started right after can overlap with the warm-up.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prewarm.errors import BadInput

# Preference order: a repo that has safetensors is loaded from them (any *.bin beside them, such as
# training_args.bin, is not read); GGUF packs are served by llama.cpp; *.bin is the old torch format.
MODEL_SUFFIXES = (".safetensors", ".gguf", ".bin")
INDEX_NAMES = {".safetensors": "model.safetensors.index.json", ".bin": "pytorch_model.bin.index.json"}
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header


def natural_key(path: Path | str) -> list[object]:
    """Sort key that puts `model-2-of-10` before `model-10-of-10`, as loaders list shards."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", str(path))]


def _walk(root: Path) -> list[Path]:
    """Regular files under `root`, skipping hidden directories (`.cache/huggingface` lock files).

    Directory links are followed (a model dir may link its shards' dirs from another disk), but each
    real directory is entered once: a link back up the tree (`a/up -> ..`) would otherwise make the
    walk run until the kernel's path limit, and two such links make it exponential (forever).
    """
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found.extend(Path(dirpath) / name for name in filenames)
    return found


def _index_order(index: Path) -> list[Path]:
    """Shards in the order they first appear in the index's weight_map (the loader's order)."""
    try:
        data = json.loads(index.read_text())
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{index}: not a usable shard index ({exc})") from None
    ordered: list[Path] = []
    seen: set[str] = set()
    for shard in weight_map.values():
        if not isinstance(shard, str) or shard in seen:
            continue
        seen.add(shard)
        ordered.append(index.parent / shard)
    missing = [p for p in ordered if not p.exists()]
    if missing:
        names = ", ".join(p.name for p in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise BadInput(
            f"{index.name} lists {len(missing)} shard(s) that are missing: {names}",
            hint="the download is incomplete; fetch the model again",
        )
    # Files the index does not name (e.g. consolidated.safetensors) are not loaded, so not warmed.
    return ordered


def model_files(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The model files under `path` (a directory, a file, or several of either), in loader order.

    A directory yields its *.safetensors (ordered by `model.safetensors.index.json` when present,
    else natural sort), or failing those its *.gguf, or failing those its *.bin.
    """
    paths = [path] if isinstance(path, str | os.PathLike) else list(path)
    if not paths:
        raise BadInput("no model path given")
    result: list[Path] = []
    for item in paths:
        result.extend(_files_of(Path(item)))
    # The same file named twice (a dir and a file inside it) is read once.
    unique: dict[Path, None] = {}
    for p in result:
        unique.setdefault(p.absolute(), None)
    return list(unique)


def _files_of(path: Path) -> list[Path]:
    if not path.exists():
        raise BadInput(f"{path}: no such file or directory")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise BadInput(f"{path}: not a regular file or directory")
    try:
        everything = _walk(path)
    except OSError as exc:
        raise BadInput(f"{path}: cannot list ({exc.strerror})") from None
    for suffix in MODEL_SUFFIXES:
        candidates = [p for p in everything if p.name.endswith(suffix) and p.is_file()]
        if not candidates:
            continue
        index_name = INDEX_NAMES.get(suffix)
        index = path / index_name if index_name else None
        if index is not None and index.is_file():
            return _index_order(index)
        return sorted(candidates, key=lambda p: natural_key(p.relative_to(path)))
    raise BadInput(
        f"{path}: no model files (*.safetensors, *.gguf or *.bin) in this directory",
        hint="point at the directory that holds the shards (a Hugging Face snapshot directory)",
    )


@dataclass(frozen=True)
class FileInfo:
    """A file as it was when the warm-up started; a later stat that differs means it changed."""

    path: Path
    size: int
    mtime_ns: int
    inode: int
    expected_size: int | None = None  # from the safetensors header, when the file has one

    def changed(self, st: os.stat_result) -> bool:
        return (st.st_size, st.st_mtime_ns, st.st_ino) != (self.size, self.mtime_ns, self.inode)


class BadHeader(ValueError):
    """The first bytes of a .safetensors file are not a safetensors header."""


def safetensors_expected_size(fd: int, size: int) -> int:
    """Bytes the file must have according to its own header (8 + header + end of the last tensor).

    Raises BadHeader for a header no loader accepts: a length past the format's 100 MiB limit (a
    length of 2^63-1 must not make anyone allocate or read that much) or a header that is not a JSON
    object.
    """
    head = os.pread(fd, 8, 0)
    if len(head) < 8:
        return 8
    (header_len,) = struct.unpack("<Q", head)
    if header_len > _MAX_SAFETENSORS_HEADER:
        raise BadHeader(
            f"header length {header_len:,} is past the format's {_MAX_SAFETENSORS_HEADER:,} limit"
        )
    if 8 + header_len > size:
        return 8 + header_len
    try:
        header = json.loads(os.pread(fd, header_len, 8))
    except (ValueError, RecursionError):
        raise BadHeader("header is not JSON") from None
    if not isinstance(header, dict):
        raise BadHeader("header is not a JSON object")
    end = 0
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        offsets = entry.get("data_offsets")
        if isinstance(offsets, list) and len(offsets) == 2 and isinstance(offsets[1], int):
            end = max(end, offsets[1])
    return 8 + header_len + end


def inspect_files(files: Iterable[str | os.PathLike[str] | FileInfo]) -> list[FileInfo]:
    """Open and stat every file once, before any worker starts, so bad input fails fast and whole.

    A FileInfo is kept as it is: a caller that inspected the files already (the CLI, for its fit check)
    passes its FileInfos on, and the headers are not parsed a second time.
    Raises BadInput listing every unreadable or truncated file (up to a few names).
    """
    infos: list[FileInfo] = []
    problems: list[str] = []
    for raw in files:
        if isinstance(raw, FileInfo):
            infos.append(raw)
            continue
        path = Path(raw)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            what = "missing" if exc.errno == 2 else f"unreadable ({exc.strerror})"
            problems.append(f"{path}: {what}")
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{path}: not a regular file")
                continue
            expected = None
            if path.name.endswith(".safetensors"):
                try:
                    expected = safetensors_expected_size(fd, st.st_size)
                except OSError as exc:
                    problems.append(f"{path}: unreadable ({exc.strerror})")
                    continue
                except BadHeader as exc:
                    problems.append(f"{path}: not a safetensors file ({exc})")
                    continue
                if st.st_size < expected:
                    problems.append(f"{path}: truncated, {st.st_size} bytes but its header says {expected}")
                    continue
            infos.append(FileInfo(path, st.st_size, st.st_mtime_ns, st.st_ino, expected))
        finally:
            os.close(fd)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        broken = ("truncated", "not a safetensors file")
        hint = "re-download the model" if any(b in p for p in problems for b in broken) else None
        raise BadInput("; ".join(problems[:3]) + more, hint=hint)
    return infos
