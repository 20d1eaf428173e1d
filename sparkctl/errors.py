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
