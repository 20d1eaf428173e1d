"""Errors a user can cause or fix, shown as one line without a traceback.

Every module raises these instead of printing and exiting, so the CLI is the single place that turns
them into a message and an exit code.
"""

from __future__ import annotations


class SparkctlError(Exception):
    """A failure the user can act on; `exit_code` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UserError(SparkctlError):
    """Bad input: a malformed recipe, an unknown name, a conflicting flag."""

    exit_code = 2


class RuntimeFailure(SparkctlError):
    """Something the tool tried to do failed (server did not become healthy, daemon unreachable)."""

    exit_code = 1


def write_failure(path: object, exc: OSError) -> RuntimeFailure:
    """An OSError from writing sparkctl's own files (state, locks, logs, keys) as one line with the path:
    a full disk or a read-only state directory is the user's to fix, not a traceback."""
    import errno

    why = exc.strerror or str(exc)
    hint = None
    if exc.errno == errno.ENOSPC:
        hint = "free space on that filesystem (or point SPARKCTL_STATE_DIR elsewhere), then try again"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = "set SPARKCTL_STATE_DIR to a writable directory"
    return RuntimeFailure(f"cannot write {exc.filename or path}: {why}", hint=hint)
