"""Sending requests: one at a time, a batch started together, or a closed loop of c streams.

Threads, one keep-alive httpx client each: the waits are network waits that release the GIL, and a
client per stream keeps connection set-up out of the timings. A stop event ends loops between
requests so Ctrl-C keeps everything measured so far.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sparkctl.bench.client import Target, timed_request
from sparkctl.bench.stream import Sample

BodyFn = Callable[[int], dict[str, Any]]  # request index -> request body


class Interrupted(Exception):
    """The stop event was set (Ctrl-C); what was measured before it is kept."""


def _warm_client(target: Target) -> Any:
    http = target.new_http()
    with contextlib.suppress(Exception):  # the first timed request reports a real failure
        http.get("/v1/models")  # opens the keep-alive connection outside any timing
    return http


def run_batch(
    target: Target,
    bodies: list[dict[str, Any]],
    *,
    count_tokens: Any = None,
    stop: threading.Event | None = None,
) -> list[Sample]:
    """Send all bodies at once (one stream each, released together by a barrier)."""
    n = len(bodies)
    clients = [_warm_client(target) for _ in range(n)]
    barrier = threading.Barrier(n)

    def one(i: int) -> Sample:
        barrier.wait()
        return timed_request(clients[i], target, bodies[i], count_tokens=count_tokens)

    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(one, i) for i in range(n)]
            return [f.result() for f in futures]
    finally:
        for c in clients:
            c.close()


def closed_loop(
    target: Target,
    body: BodyFn,
    streams: int,
    total: int,
    *,
    count_tokens: Any = None,
    stop: threading.Event | None = None,
    on_sample: Callable[[Sample], None] | None = None,
) -> list[Sample]:
    """`streams` workers; each sends its next request when its previous one ends, `total` in all."""
    stop = stop or threading.Event()
    lock = threading.Lock()
    next_index = [0]
    out: list[tuple[int, Sample]] = []
    clients = [_warm_client(target) for _ in range(streams)]

    def worker(w: int) -> None:
        while not stop.is_set():
            with lock:
                i = next_index[0]
                if i >= total:
                    return
                next_index[0] += 1
            s = timed_request(clients[w], target, body(i), count_tokens=count_tokens)
            with lock:
                out.append((i, s))
            if on_sample is not None:
                on_sample(s)

    pool = ThreadPoolExecutor(max_workers=streams)
    try:
        futures = [pool.submit(worker, w) for w in range(streams)]
        for f in futures:
            f.result()
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        for c in clients:
            c.close()
        raise
    pool.shutdown()
    for c in clients:
        c.close()
    return [s for _, s in sorted(out, key=lambda x: x[0])]
