"""One way to write a file that a reader (or a crash) never sees half-written: temp file, then rename.

Every file sparkctl writes for a user or for itself later (state files, kept logs, `render -o`, `schema
-o`) goes through `write_atomic`, so "nothing a user had is lost or half-written" holds in one place.
(`prewarm` and the plugin's checkpoint writer are separate packages that do not import sparkctl; they
keep their own few lines.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(
    path: Path | str, data: str | bytes, *, fsync: bool = False, mode: int | None = None
) -> Path:
    """Write `data` to `path` through a temp file in the same directory and a rename.

    `fsync` flushes the bytes to disk before the rename (state files: the record must survive a power cut);
    `mode` sets the permissions (mkstemp makes 0600). Raises OSError; on any failure the temp file is gone
    and a previous `path` is untouched.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
