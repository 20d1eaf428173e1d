"""The parallel reader: N threads take byte ranges from one queue filled in loader order.

Threads, not processes: a thread blocked in pread/sendfile has released the GIL, so N threads keep N
requests in flight, which is what a single reader (one or two readahead windows deep) cannot do.
Each worker owns one page-aligned buffer (an anonymous mmap) and reuses it for every chunk.
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from prewarm.errors import BadInput, Interrupted
from prewarm.files import FileInfo, inspect_files
from prewarm.report import FileResult, WarmReport, WorkerResult, host_facts
from prewarm.residency import PAGE_SIZE, evict, resident_bytes

MiB = 1 << 20
DEFAULT_WORKERS = 8
DEFAULT_CHUNK = 16 * MiB  # one read; vLLM's prefetch uses 16 MiB blocks too
DEFAULT_ITEM = 64 * MiB  # one unit of work: a worker reads 4 chunks of one file in a row
_DIRECT_ALIGN = 4096  # O_DIRECT offset/length alignment; covers 512 B and 4 KiB logical blocks

Method = Literal["pread", "sendfile", "o_direct"]


@dataclass(frozen=True)
class Progress:
    """A snapshot handed to `on_progress` about every `progress_interval` seconds."""

    bytes_done: int
    total_bytes: int
    elapsed: float
    files_done: int
    files_total: int


class DirectIONotSupported(OSError):
    """The filesystem refuses O_DIRECT (tmpfs, some FUSE and network filesystems)."""


class _FileState:
    __slots__ = ("info", "remaining", "read", "first", "last", "error", "short")

    def __init__(self, info: FileInfo) -> None:
        self.info = info
        self.remaining = info.size
        self.read = 0
        self.first: float | None = None
        self.last: float | None = None
        self.error: str | None = None
        self.short = False  # hit end of file before the size it had at the start


class _Run:
    """Shared state of one parallel read; every mutable field is guarded by `lock`."""

    def __init__(
        self,
        infos: list[FileInfo],
        *,
        method: Method,
        workers: int,
        chunk: int,
        item: int,
        stop: threading.Event,
        limit_rate: float | None,
    ) -> None:
        self.files = [_FileState(i) for i in infos]
        self.method = method
        self.chunk = chunk
        self.stop = stop
        self.limit_rate = limit_rate
        self.lock = threading.Lock()
        self.done = 0
        self.files_done = sum(1 for f in self.files if f.remaining == 0)
        self.workers = [WorkerResult(i) for i in range(workers)]
        self.items: queue.SimpleQueue[tuple[int, int, int]] = queue.SimpleQueue()
        for idx, info in enumerate(infos):
            for off in range(0, info.size, item):
                self.items.put((idx, off, min(item, info.size - off)))
        self.t0 = time.perf_counter()
        self.fatal: BaseException | None = None
        self.sendfile_ok = True

    def account(self, idx: int, n: int, now: float) -> None:
        with self.lock:
            state = self.files[idx]
            state.read += n
            state.remaining -= n
            state.last = now
            self.done += n
            if state.remaining <= 0:
                self.files_done += 1

    def throttle(self) -> None:
        if not self.limit_rate:
            return
        with self.lock:
            due = self.t0 + self.done / self.limit_rate
        delay = due - time.perf_counter()
        if delay > 0:
            self.stop.wait(delay)

    def worker(self, wid: int) -> None:
        buf = mmap.mmap(-1, self.chunk)
        view = memoryview(buf)
        fds: dict[int, int] = {}
        devnull = os.open(os.devnull, os.O_WRONLY) if self.method == "sendfile" else -1
        result = self.workers[wid]
        try:
            while not self.stop.is_set():
                try:
                    idx, off, length = self.items.get_nowait()
                except queue.Empty:
                    return
                state = self.files[idx]
                if state.error or state.short:
                    continue
                started = time.perf_counter()
                try:
                    fd = fds.get(idx)
                    if fd is None:
                        fd = fds[idx] = self._open(state.info.path)
                    with self.lock:
                        if state.first is None:
                            state.first = started
                    self._read_range(fd, idx, off, length, view, devnull, result)
                except DirectIONotSupported as exc:
                    self.fatal = exc
                    self.stop.set()
                    return
                except OSError as exc:
                    with self.lock:
                        state.error = f"read failed: {exc.strerror or exc}"
                finally:
                    result.busy_seconds += time.perf_counter() - started
        except BaseException as exc:  # never let a worker die silently; the main thread re-raises
            self.fatal = exc
            self.stop.set()
        finally:
            for fd in fds.values():
                os.close(fd)
            if devnull >= 0:
                os.close(devnull)
            view.release()
            buf.close()

    def _open(self, path: Path) -> int:
        flags = os.O_RDONLY | os.O_CLOEXEC
        if self.method == "o_direct":
            try:
                return os.open(path, flags | os.O_DIRECT)
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    raise DirectIONotSupported(
                        exc.errno, f"{path}: the filesystem refuses O_DIRECT"
                    ) from None
                raise
        fd = os.open(path, flags)
        # SEQUENTIAL doubles this descriptor's readahead window; each worker reads 4 chunks in a row.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def _read_range(
        self, fd: int, idx: int, off: int, length: int, view: memoryview, devnull: int, result: WorkerResult
    ) -> None:
        end = off + length
        while off < end and not self.stop.is_set():
            n = min(self.chunk, end - off)
            if self.method == "sendfile" and self.sendfile_ok:
                try:
                    got = os.sendfile(devnull, fd, off, n)
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                        raise
                    # Some filesystems cannot splice; read through the buffer instead, same cache effect.
                    self.sendfile_ok = False
                    continue
            elif self.method == "o_direct":
                aligned = (n + _DIRECT_ALIGN - 1) // _DIRECT_ALIGN * _DIRECT_ALIGN
                try:
                    got = min(os.preadv(fd, [view[:aligned]], off), n)
                except OSError as exc:
                    if exc.errno == errno.EINVAL:
                        raise DirectIONotSupported(
                            exc.errno, "the filesystem refuses O_DIRECT reads"
                        ) from None
                    raise
            else:
                got = os.preadv(fd, [view[:n]], off)
            if got <= 0:
                with self.lock:
                    self.files[idx].short = True
                return
            off += got
            self.account(idx, got, time.perf_counter())
            result.bytes += got
            self.throttle()

    def snapshot(self) -> Progress:
        with self.lock:
            return Progress(
                self.done,
                sum(f.info.size for f in self.files),
                time.perf_counter() - self.t0,
                self.files_done,
                len(self.files),
            )


class _Worker(threading.Thread):
    def __init__(self, run: _Run, wid: int) -> None:
        super().__init__(name=f"prewarm-{wid}", daemon=True)
        self.worker_id = wid
        self.run_state = run

    def run(self) -> None:
        self.run_state.worker(self.worker_id)


def read_files(
    infos: list[FileInfo],
    *,
    method: Method = "pread",
    workers: int = DEFAULT_WORKERS,
    chunk_bytes: int = DEFAULT_CHUNK,
    item_bytes: int = DEFAULT_ITEM,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval: float = 0.5,
    stop: threading.Event | None = None,
    limit_rate: float | None = None,
) -> tuple[_Run, bool]:
    """Read every byte of `infos` with `workers` threads; returns the run and whether Ctrl-C hit.

    The main thread only waits and reports progress, so it is the one that sees KeyboardInterrupt;
    it then sets `stop`, and every worker finishes its current chunk and exits.
    """
    if workers < 1:
        raise BadInput("workers must be at least 1")
    if chunk_bytes < PAGE_SIZE or chunk_bytes % PAGE_SIZE:
        raise BadInput(f"chunk size must be a multiple of the page size ({PAGE_SIZE} bytes)")
    item_bytes = max(chunk_bytes, item_bytes // chunk_bytes * chunk_bytes)
    # The run's own event: set by Ctrl-C, by the caller's `stop`, or by a worker that hit a fatal error.
    halt = threading.Event()
    run = _Run(
        infos,
        method=method,
        workers=workers,
        chunk=chunk_bytes,
        item=item_bytes,
        stop=halt,
        limit_rate=limit_rate,
    )
    threads = [_Worker(run, i) for i in range(workers)]
    interrupted = False
    try:
        for t in threads:
            t.start()
        next_report = time.perf_counter() + progress_interval
        while any(t.is_alive() for t in threads):
            time.sleep(0.05)
            if stop is not None and stop.is_set():
                halt.set()
            if on_progress and time.perf_counter() >= next_report:
                on_progress(run.snapshot())
                next_report += progress_interval
    except KeyboardInterrupt:  # also while the threads are being started: join only those that run
        interrupted = True
        halt.set()
        for t in threads:
            if t.ident is not None:
                t.join()
    except BaseException:  # e.g. a failing on_progress callback: never leave readers running
        halt.set()
        for t in threads:
            if t.ident is not None:
                t.join()
        raise
    if on_progress and not interrupted:
        on_progress(run.snapshot())
    if run.fatal is not None:
        raise run.fatal
    return run, interrupted


def _results(run: _Run, before: list[int], *, residency_after: bool, report: WarmReport) -> None:
    """Fill `report` with per-file results, flagging files that changed while they were read."""
    for state, res_before in zip(run.files, before, strict=True):
        info = state.info
        seconds = (state.last - state.first) if state.first is not None and state.last is not None else 0.0
        fr = FileResult(str(info.path), info.size, state.read, seconds, res_before, error=state.error)
        try:
            st = os.stat(info.path)
        except OSError:
            fr.changed = True
            report.warnings.append(f"{info.path}: removed or replaced during the read")
        else:
            if info.changed(st) or state.short:
                fr.changed = True
                report.warnings.append(
                    f"{info.path}: changed during the read (size {info.size} -> {st.st_size}); "
                    "is a download still writing it? run again once it has finished"
                )
            if residency_after:
                fr.resident_after = resident_bytes(info.path)
        if state.error:
            report.warnings.append(f"{info.path}: {state.error}")
        report.files.append(fr)
    report.per_worker = run.workers


def warm(
    files: Iterable[str | os.PathLike[str] | FileInfo],
    *,
    workers: int = DEFAULT_WORKERS,
    chunk_bytes: int = DEFAULT_CHUNK,
    item_bytes: int = DEFAULT_ITEM,
    method: Literal["pread", "sendfile"] = "sendfile",
    cold: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval: float = 0.5,
    stop: threading.Event | None = None,
    limit_rate: float | None = None,
    residency_check: bool = True,
) -> WarmReport:
    """Pull `files` (paths, or FileInfos from inspect_files) into the page cache and report what happened.

    `cold=True` evicts the files first (and verifies it), so the GiB/s measures the disk, not RAM.
    Raises BadInput for missing/unreadable/truncated files before reading anything, and
    `Interrupted` (a KeyboardInterrupt carrying the partial report) on Ctrl-C.
    """
    if method not in ("pread", "sendfile"):
        raise BadInput(f"unknown read method {method!r} (pread or sendfile)")
    infos = inspect_files(files)
    report = WarmReport(
        "cold" if cold else "warm", method, workers, chunk_bytes, host=host_facts(i.path for i in infos)
    )
    report.mem_available_before = _mem_available()
    ra = report.host.get("read_ahead_kb")
    if isinstance(ra, int) and ra < 1024:
        # The notes: a bigger readahead helps every buffered reader, the server's loader included.
        report.notes.append(
            f"{report.host.get('device')} has read_ahead_kb={ra}; as root, "
            f"`echo 8192 > /sys/block/{report.host.get('device')}/queue/read_ahead_kb` speeds up buffered reads"
        )
    if cold:
        ev = evict([i.path for i in infos])
        report.evict_seconds = ev.seconds
    before = [resident_bytes(i.path) for i in infos] if residency_check else [0] * len(infos)
    if residency_check and sum(before) > 0.01 * max(1, sum(i.size for i in infos)):
        pct = 100 * sum(before) / max(1, sum(i.size for i in infos))
        if cold:  # the eviction did not take: the GiB/s below is partly a memory copy
            report.warnings.append(f"NOT COLD: {pct:.1f} % was still in the page cache after eviction")
        else:
            report.notes.append(f"{pct:.1f} % was already in the page cache before the read")
    run, interrupted = read_files(
        infos,
        method=method,
        workers=workers,
        chunk_bytes=chunk_bytes,
        item_bytes=item_bytes,
        on_progress=on_progress,
        progress_interval=progress_interval,
        stop=stop,
        limit_rate=limit_rate,
    )
    if method == "sendfile" and not run.sendfile_ok:
        report.method = "pread"
        report.notes.append("sendfile is not supported for these files; read through a buffer instead")
    _finish(report, run, before, interrupted, stop=stop, residency_after=residency_check)
    if residency_check and not report.interrupted and not report.failed and report.residency_after < 0.99:
        report.warnings.append(
            f"only {100 * report.residency_after:.1f} % stayed in the page cache: pages were evicted "
            "under memory pressure while reading"
        )
    return report


def measure_disk(
    files: Iterable[str | os.PathLike[str] | FileInfo],
    *,
    workers: int = DEFAULT_WORKERS,
    chunk_bytes: int = DEFAULT_CHUNK,
    item_bytes: int = DEFAULT_ITEM,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval: float = 0.5,
    stop: threading.Event | None = None,
) -> WarmReport:
    """The device's parallel read ceiling: O_DIRECT reads that bypass (and do not fill) the cache.

    If the filesystem refuses O_DIRECT, falls back to evict + buffered read and says so in `notes`.
    """
    infos = inspect_files(files)
    report = WarmReport(
        "measure-disk", "o_direct", workers, chunk_bytes, host=host_facts(i.path for i in infos)
    )
    report.mem_available_before = _mem_available()
    before = [resident_bytes(i.path) for i in infos]
    read = partial(
        read_files,
        infos,
        workers=workers,
        chunk_bytes=chunk_bytes,
        item_bytes=item_bytes,
        on_progress=on_progress,
        progress_interval=progress_interval,
        stop=stop,
    )
    try:
        run, interrupted = read(method="o_direct")
    except DirectIONotSupported:
        fs = report.host.get("filesystem") or "this filesystem"
        report.method = "evict+pread"
        report.notes.append(
            f"O_DIRECT is refused by {fs}; measured a cold buffered read instead (evict, then read), "
            "which is a lower bound on the device ceiling"
        )
        report.evict_seconds = evict([i.path for i in infos]).seconds
        before = [resident_bytes(i.path) for i in infos]
        run, interrupted = read(method="pread")
    return _finish(report, run, before, interrupted, stop=stop, residency_after=True)


def _finish(
    report: WarmReport,
    run: _Run,
    before: list[int],
    interrupted: bool,
    *,
    stop: threading.Event | None,
    residency_after: bool,
) -> WarmReport:
    """The common end of warm() and measure_disk(): timing, per-file results, Ctrl-C as Interrupted."""
    report.seconds = time.perf_counter() - run.t0
    report.interrupted = interrupted or (stop is not None and stop.is_set())
    _results(run, before, residency_after=residency_after, report=report)
    report.mem_available_after = _mem_available()
    if interrupted:
        raise Interrupted(report)
    return report


def _mem_available() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # psutil missing or /proc unreadable: the report just lacks the figure
        return None
