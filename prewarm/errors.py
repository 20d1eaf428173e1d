"""Errors the pre-warmer raises, each carrying the exit code the command line should use.

`prewarm` is usable on its own (`python -m prewarm`), so it does not import sparkctl; the sparkctl
command translates these into its own UserError / RuntimeFailure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prewarm.report import WarmReport


class PrewarmError(Exception):
    """Something the user can act on; shown as one line, never a traceback."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class BadInput(PrewarmError):
    """Missing or unreadable files, a truncated shard, a directory without model files: exit 2."""

    exit_code = 2


class DoesNotFit(PrewarmError):
    """Warming would push the host (or its cgroup) below the memory headroom; `--force` overrides."""

    exit_code = 1

    def __init__(self, message: str, *, fit: Any, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.fit = fit


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a read: the workers have stopped and `report` holds what was done so far.

    A KeyboardInterrupt subclass, so a caller that does not care still aborts as on any Ctrl-C.
    """

    def __init__(self, report: WarmReport) -> None:
        super().__init__("interrupted")
        self.report = report
