"""Helpers shared by the prewarm tests (a plain module: importable however pytest is started)."""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def write_shard(path: Path, nbytes: int, *, declared: int | None = None) -> Path:
    """A valid safetensors file with one U8 tensor of `nbytes` random bytes.

    `declared` makes the header claim a different tensor size (a truncated download).
    """
    size = nbytes if declared is None else declared
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)))
        fh.write(header)
        fh.write(os.urandom(nbytes))
        fh.flush()
        os.fsync(fh.fileno())  # so DONTNEED can drop the pages at once (no dirty pages left)
    return path


def write_index(model_dir: Path, order: list[str]) -> None:
    weight_map = {f"layer.{i}.weight": name for i, name in enumerate(order)}
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


def prewarm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "prewarm", *args]


def as_nobody(fn: Callable[[], object]) -> str:
    """Run `fn` in a forked child that dropped to user nobody (root reads anything, so unreadable-file
    tests use this when run as root); returns "BadInput <message>", another exception's repr, or "no error".

    The child does not exec, so the venv's location does not matter.
    """
    from prewarm.errors import BadInput

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        msg = b"no error"
        try:
            os.setgid(65534)
            os.setuid(65534)
            fn()
        except BadInput as exc:
            msg = f"BadInput {exc}".encode()
        except BaseException as exc:
            msg = repr(exc).encode()
        os.write(wfd, msg)
        os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as fh:
        out = fh.read().decode()
    os.waitpid(pid, 0)
    return out
