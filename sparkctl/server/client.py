"""A small OpenAI-compatible client on httpx: the few calls `up`, `status` and `chat` make.

Not the `openai` package: three endpoints do not justify another dependency, and httpx gives the
timeouts and streaming we need directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from sparkctl.errors import RuntimeFailure
from sparkctl.server.auth import headers


@dataclass(frozen=True)
class ChatResult:
    content: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    seconds: float


def probe_health(base_url: str, *, timeout_s: float = 2.0) -> bool:
    """True when GET /health answers 200; any connection error or other status is False."""
    try:
        return httpx.get(f"{base_url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def list_models(base_url: str, *, timeout_s: float = 5.0, api_key: str | None = None) -> list[str]:
    """Ids from GET /v1/models; raises httpx errors to the caller (the health gate retries them)."""
    resp = httpx.get(f"{base_url}/v1/models", timeout=timeout_s, headers=headers(api_key))
    resp.raise_for_status()
    return [m["id"] for m in resp.json().get("data", [])]


def _chat_body(model: str, message: str, max_tokens: int, temperature: float) -> dict[str, Any]:
    """The one-user-message request both chat calls send (the streamed one adds "stream")."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": message}],
        "max_tokens": max_tokens,
        "temperature": temperature,
    }


def chat(
    base_url: str,
    model: str,
    message: str,
    *,
    max_tokens: int = 16,
    temperature: float = 0.0,
    timeout_s: float = 120.0,
    api_key: str | None = None,
) -> ChatResult:
    """One non-streamed chat completion; a non-200 or a malformed body is a RuntimeFailure."""
    body = _chat_body(model, message, max_tokens, temperature)
    try:
        resp = httpx.post(
            f"{base_url}/v1/chat/completions", json=body, timeout=timeout_s, headers=headers(api_key)
        )
    except httpx.HTTPError as exc:
        raise RuntimeFailure(f"chat request to {base_url} failed: {exc}") from exc
    if resp.status_code != 200:
        raise RuntimeFailure(f"chat request to {base_url} answered {resp.status_code}: {_error_text(resp)}")
    try:
        data = resp.json()
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        return ChatResult(
            content=choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            seconds=resp.elapsed.total_seconds(),
        )
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise RuntimeFailure(
            f"chat response from {base_url} is not an OpenAI chat completion: {exc}"
        ) from exc


def stream_chat(
    base_url: str,
    model: str,
    message: str,
    *,
    max_tokens: int = 64,
    temperature: float = 0.7,
    timeout_s: float = 120.0,
    api_key: str | None = None,
) -> Iterator[str]:
    """Yield content pieces of a streamed chat completion as the server sends them (SSE)."""
    body = _chat_body(model, message, max_tokens, temperature) | {"stream": True}
    try:
        with httpx.stream(
            "POST", f"{base_url}/v1/chat/completions", json=body, timeout=timeout_s, headers=headers(api_key)
        ) as resp:
            if resp.status_code != 200:
                resp.read()
                raise RuntimeFailure(
                    f"chat request to {base_url} answered {resp.status_code}: {_error_text(resp)}"
                )
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                try:
                    event = json.loads(payload)
                except ValueError as exc:
                    raise RuntimeFailure(f"malformed stream event from {base_url}: {payload[:200]}") from exc
                if "error" in event:
                    raise RuntimeFailure(f"server error during the stream: {event['error']}")
                for choice in event.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        yield piece
    except httpx.HTTPError as exc:
        raise RuntimeFailure(f"chat request to {base_url} failed: {exc}") from exc


def _error_text(resp: httpx.Response) -> str:
    try:
        data = resp.json()
        err = data.get("error", data)
        return str(err.get("message", err) if isinstance(err, dict) else err)[:300]
    except ValueError:
        return resp.text[:300]
