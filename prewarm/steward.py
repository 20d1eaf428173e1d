"""Keep model shards out of the page cache while a server loads them (unified-memory hosts).

A loader pulls every shard through the page cache; on a GB10 those cached pages are memory the GPU
cannot have, and vLLM sizes its KV cache from what looks free. The steward advises DONTNEED on every
shard every `interval` seconds until it is stopped (when the server reports ready), then does a last
verified eviction. Pages the server itself has mapped are left alone by the kernel, so this never
takes memory from under the server.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from prewarm.residency import EvictReport, drop, evict


class EvictionSteward:
    """`with EvictionSteward(files): wait_until_ready()`, or `start()` ... `stop()`."""

    def __init__(self, files: Iterable[str | os.PathLike[str]], *, interval: float = 1.0) -> None:
        self.files = [Path(f) for f in files]
        self.interval = interval
        self.passes = 0
        self.errors: list[str] = []
        self.final: EvictReport | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> EvictionSteward:
        if self._thread is not None:
            raise RuntimeError("steward already started")
        self._thread = threading.Thread(target=self._loop, name="prewarm-steward", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            started = time.monotonic()
            self.evict_once()
            if self._stop.wait(max(0.0, self.interval - (time.monotonic() - started))):
                return

    def evict_once(self) -> None:
        """One DONTNEED per file; a file not there yet (still downloading) is simply skipped."""
        for path in self.files:
            try:
                drop(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                msg = f"{path}: {exc.strerror or exc}"
                if msg not in self.errors:
                    self.errors.append(msg)
        self.passes += 1

    def stop(self, *, verify: bool = True) -> EvictReport | None:
        """Stop the thread, evict one last time and (by default) measure what stayed cached."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        existing = [p for p in self.files if p.exists()]
        self.final = evict(existing, verify=verify)
        return self.final

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> EvictionSteward:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(verify=exc is None)
