"""A rich progress bar for the benchmark (a line per workload when stderr is not a terminal)."""

from __future__ import annotations

from typing import Any

from sparkctl.bench.workloads import Progress


class RichProgress(Progress):
    def __init__(self, console: Any) -> None:
        self.console = console
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=self.console, transient=True,
            )  # fmt: skip
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def task(self, label: str, total: int) -> None:
        if self._bar is not None:
            self._task = self._bar.add_task(f"bench {label}", total=total)
        else:
            self.console.print(f"bench {label}: {total} measured requests planned")

    def advance(self, n: int = 1) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, n)

    def note(self, message: str) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=message)
        else:
            self.console.print(f"  … {message}")
