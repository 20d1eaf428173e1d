"""Live progress: a rich bar (GiB, GiB/s, ETA) on a terminal, plain lines once a second otherwise.

Plain lines keep CI logs and `| tee` readable; everything goes to stderr so stdout stays the report.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import IO, Any

from prewarm.warm import Progress

GiB = 1 << 30


class ProgressView:
    """Context manager whose `update` is the `on_progress` callback of warm()/measure_disk()."""

    def __init__(
        self,
        label: str,
        total_bytes: int,
        files_total: int,
        *,
        stream: IO[str] | None = None,
        plain: bool | None = None,
    ) -> None:
        self.label = label
        self.total = total_bytes
        self.files_total = files_total
        self.stream = stream or sys.stderr
        self.plain = (not self.stream.isatty()) if plain is None else plain
        self._progress: Any = None
        self._task: Any = None
        self._last_line = 0.0
        self._last: Progress | None = None
        self._printed: Progress | None = None

    def __enter__(self) -> ProgressView:
        if not self.plain:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            self._progress = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                DownloadColumn(binary_units=True),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                TextColumn("files {task.fields[files]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total, files=f"0/{self.files_total}")
        return self

    def update(self, p: Progress) -> None:
        self._last = p
        if self._progress is not None:
            self._progress.update(self._task, completed=p.bytes_done, files=f"{p.files_done}/{p.files_total}")
            return
        now = time.monotonic()
        if now - self._last_line >= 1.0:
            self._last_line = now
            self._printed = p
            self.stream.write(self.line(p) + "\n")
            self.stream.flush()

    def line(self, p: Progress) -> str:
        rate = p.bytes_done / GiB / p.elapsed if p.elapsed > 0 else 0.0
        pct = 100 * p.bytes_done / p.total_bytes if p.total_bytes else 100.0
        left = (p.total_bytes - p.bytes_done) / GiB / rate if rate > 0 else float("inf")
        eta = f"{left:.1f} s" if left != float("inf") else "?"
        return (
            f"{self.label}: {p.bytes_done / GiB:.2f}/{p.total_bytes / GiB:.2f} GiB {pct:5.1f} % "
            f"{rate:.2f} GiB/s ETA {eta} files {p.files_done}/{p.files_total}"
        )

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif self._last is not None and self._last is not self._printed:
            self.stream.write(self.line(self._last) + "\n")
            self.stream.flush()
