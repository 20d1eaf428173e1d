"""The health gate: a launched server counts as up only when it answers, lists its model and chats.

`/health` answering 200 means the API process is serving; `/v1/models` listing the served name means
it is *our* model that loaded (not a stranger on the port). A server that dies during start-up is
noticed on the next poll, not at the timeout, and both failures carry the log's last lines and a
diagnosis so the user sees why without digging.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from sparkctl.errors import RuntimeFailure
from sparkctl.server import client
from sparkctl.server.diagnose import hint_for

LOG_TAIL_LINES = 50  # shown to the user
DIAGNOSE_LINES = 200_000  # scanned for a known cause: the root cause is rarely in the last 50


class StartupFailed(RuntimeFailure):
    """The server did not come up; `log_tail` holds its last log lines for the user."""

    def __init__(self, message: str, *, hint: str | None, log_tail: list[str]) -> None:
        super().__init__(message, hint=hint)
        self.log_tail = log_tail


class ServerExited(StartupFailed):
    pass


class HealthTimeout(StartupFailed):
    pass


@dataclass(frozen=True)
class Tick:
    """What the live status line shows while waiting."""

    elapsed_s: float
    phase: str  # "starting" (no answer yet) | "loading" (/health ok, model not listed yet)
    last_line: str | None


def wait_healthy(
    base_url: str,
    model: str,
    *,
    label: str,
    timeout_s: float,
    exit_detail: Callable[[], str | None],
    last_lines: Callable[[int], list[str]],
    on_tick: Callable[[Tick], None] | None = None,
    poll_s: float = 0.5,
    api_key: str | None = None,
) -> float:
    """Block until `base_url` is healthy and serves `model`; return the seconds it took.

    `exit_detail()` is None while the server runs, else why it stopped; `last_lines(n)` reads its log.
    """
    t0 = time.monotonic()
    phase = "starting"
    seen_models: list[str] = []
    with httpx.Client(timeout=2.0) as http:
        while True:
            elapsed = time.monotonic() - t0
            detail = exit_detail()
            if detail is not None:
                log = last_lines(DIAGNOSE_LINES)
                tail = log[-LOG_TAIL_LINES:]
                raise ServerExited(
                    f"{label} stopped during start-up after {elapsed:.0f}s: {detail}",
                    hint=hint_for(
                        log, fallback=f"the log lines above say why; all of them: sparkctl logs {label}"
                    ),
                    log_tail=tail,
                )
            if _ok(http, f"{base_url}/health"):
                phase = "loading"
                try:
                    seen_models = client.list_models(base_url, timeout_s=2.0, api_key=api_key)
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    seen_models = []
                if model in seen_models:
                    return time.monotonic() - t0
            if elapsed >= timeout_s:
                log = last_lines(DIAGNOSE_LINES)
                tail = log[-LOG_TAIL_LINES:]
                if seen_models:
                    what = f"it serves {', '.join(seen_models)}, not {model}"
                elif phase == "loading":
                    what = "/health answers but /v1/models does not list the model"
                else:
                    what = f"no answer on {base_url}/health"
                raise HealthTimeout(
                    f"{label} was not healthy within {timeout_s:.0f}s: {what}",
                    hint=hint_for(
                        log,
                        fallback="the server may just be slow to load: raise serve.health_timeout_s, "
                        f"or watch it with sparkctl logs -f {label}",
                    ),
                    log_tail=tail,
                )
            if on_tick is not None:
                lines = last_lines(1)
                on_tick(Tick(elapsed, phase, lines[-1] if lines else None))
            time.sleep(poll_s)


def smoke_test(
    base_url: str, model: str, *, timeout_s: float = 120.0, api_key: str | None = None
) -> client.ChatResult:
    """One real, non-streamed chat completion: proves the model generates, not just that HTTP answers."""
    result = client.chat(
        base_url,
        model,
        "Say hello in one short sentence.",
        max_tokens=12,
        timeout_s=timeout_s,
        api_key=api_key,
    )
    if result.completion_tokens < 1:
        raise RuntimeFailure(
            f"smoke test: {model} at {base_url} answered a chat request with no tokens",
            hint="the server is up but does not generate; check its log for errors",
        )
    return result


def _ok(http: httpx.Client, url: str) -> bool:
    try:
        return http.get(url).status_code == 200
    except httpx.HTTPError:
        return False
