"""The benchmark's HTTP side: one timed streaming request, and the server calls around it.

Timestamps are taken with perf_counter as each SSE line arrives, before any JSON parsing, on a
keep-alive httpx connection opened before timing starts. Failures a user can fix (nothing
listening, a key required, a wrong model name, a prompt too long, a server that does not stream)
become BenchInputError: one line, exit 2.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkctl.bench.stream import Sample, TimedEvent, measure
from sparkctl.errors import UserError


class BenchInputError(UserError):
    """Bad input for a benchmark (unreachable server, wrong model, too long a prompt...): exit 2."""


_TOO_LONG = re.compile(
    r"maximum context length|context length|too long|max_model_len|maximum input length", re.I
)


@dataclass
class Target:
    base_url: str  # http://host:port (no /v1)
    model: str
    api_key: str | None = None
    api: str = "chat"  # "chat" | "completions"
    timeout_s: float = 600.0
    continuous_usage: bool = True  # dropped automatically if the server rejects it
    extra_body: dict[str, Any] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def new_http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers=self.headers(),
            timeout=httpx.Timeout(self.timeout_s, connect=10.0),
            limits=httpx.Limits(max_keepalive_connections=4),
        )


def normalize_url(url: str) -> str:
    """Accept http://h:p, http://h:p/ and http://h:p/v1 alike."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _error_message(resp: httpx.Response) -> str:
    try:
        data = resp.json()
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message", err) if isinstance(err, dict) else err
        return str(msg)[:300]
    except ValueError:
        return resp.text[:300]


def check_response(resp: httpx.Response, target: Target) -> None:
    """Turn the statuses a user can fix into one-line BenchInputErrors."""
    if resp.status_code == 200:
        return
    msg = _error_message(resp)
    if resp.status_code in (401, 403):
        raise BenchInputError(
            f"{target.base_url} requires an API key ({resp.status_code}: {msg})",
            hint="pass --api-key KEY (or set OPENAI_API_KEY)",
        )
    if resp.status_code == 404 and "model" in msg.lower():
        raise BenchInputError(f"model {target.model!r} is not served at {target.base_url}: {msg}")
    if resp.status_code in (400, 413) and _TOO_LONG.search(msg):
        raise BenchInputError(
            f"the prompt is too long for the model's context: {msg}",
            hint="use a smaller --long-tokens / grid depth, or serve with a larger max_model_len",
        )
    raise BenchInputError(f"{target.base_url} answered {resp.status_code}: {msg}")


def served_models(http: httpx.Client, target: Target) -> list[dict[str, Any]]:
    """GET /v1/models; unreachable or unauthorised servers are BenchInputErrors."""
    try:
        resp = http.get("/v1/models")
    except httpx.HTTPError as exc:
        raise BenchInputError(
            f"cannot reach {target.base_url}: {exc.__class__.__name__}: {exc}",
            hint="is the server up? sparkctl status, or sparkctl bench RECIPE --up",
        ) from exc
    check_response(resp, target)
    try:
        return list(resp.json().get("data", []))
    except (ValueError, AttributeError) as exc:
        raise BenchInputError(f"{target.base_url}/v1/models is not an OpenAI model list") from exc


def resolve_model(http: httpx.Client, target: Target) -> dict[str, Any]:
    """The /v1/models entry benchmarked: the named one, or the only one served."""
    models = served_models(http, target)
    ids = [m.get("id") for m in models]
    if not target.model:
        if len(ids) == 1:
            target.model = ids[0]
            return models[0]
        raise BenchInputError(
            f"{target.base_url} serves {len(ids)} models ({', '.join(map(str, ids)) or 'none'})",
            hint="name one with --model NAME",
        )
    for m in models:
        if m.get("id") == target.model:
            return m
    raise BenchInputError(
        f"model {target.model!r} is not served at {target.base_url} (it serves: {', '.join(map(str, ids)) or 'none'})",
        hint="pass --model with one of those names",
    )


def request_body(
    target: Target,
    messages: list[dict[str, Any]] | str,
    max_tokens: int,
    *,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """Fixed-length, greedy, streamed with usage (continuous usage when the server accepts it)."""
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.continuous_usage:
        body["stream_options"]["continuous_usage_stats"] = True
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if target.api == "chat":
        body["messages"] = messages if isinstance(messages, list) else [{"role": "user", "content": messages}]
    else:
        body["prompt"] = messages if isinstance(messages, str) else "\n".join(m["content"] for m in messages)
    body.update(target.extra_body)
    return body


def timed_request(
    http: httpx.Client,
    target: Target,
    body: dict[str, Any],
    *,
    count_tokens: Any = None,
) -> Sample:
    """Send one streamed request and measure it. Bad-input statuses raise; a broken stream is a failed Sample."""
    path = "/v1/chat/completions" if target.api == "chat" else "/v1/completions"
    events: list[TimedEvent] = []
    t_send = time.perf_counter()
    try:
        with http.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                resp.read()
                if resp.status_code == 400 and target.continuous_usage and "continuous_usage" in resp.text:
                    target.continuous_usage = False
                    body["stream_options"].pop("continuous_usage_stats", None)
                    return timed_request(http, target, body, count_tokens=count_tokens)
                check_response(resp, target)
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                resp.read()
                raise BenchInputError(
                    f"{target.base_url} did not stream (content-type {ctype or 'none'}, not text/event-stream)",
                    hint='sparkctl bench needs a server that honours "stream": true (Server-Sent Events)',
                )
            for line in resp.iter_lines():
                t = time.perf_counter()
                if line.startswith("data:"):
                    events.append(TimedEvent(t, line[5:].strip()))
    except httpx.HTTPError as exc:
        s = Sample(ok=False, error=f"{exc.__class__.__name__}: {exc}"[:300], t_send_abs=t_send)
        return s
    try:
        return measure(events, t_send, count_tokens=count_tokens)
    except ValueError as exc:
        return Sample(ok=False, error=f"malformed SSE event: {exc}"[:300], t_send_abs=t_send)


def tokenize_count(http: httpx.Client, target: Target, messages: list[dict[str, Any]] | str) -> int | None:
    """Prompt tokens by the server's own tokenizer (vLLM/SGLang /tokenize), chat template included."""
    body: dict[str, Any] = {"model": target.model}
    if target.api == "chat" and isinstance(messages, list):
        body["messages"] = messages
    else:
        body["prompt"] = messages if isinstance(messages, str) else "\n".join(m["content"] for m in messages)
    try:
        resp = http.post("/tokenize", json=body)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    data = resp.json()
    if "count" in data:
        return int(data["count"])
    if "tokens" in data:
        return len(data["tokens"])
    return None


def server_version(http: httpx.Client) -> str | None:
    try:
        resp = http.get("/version")
        if resp.status_code == 200:
            return str(resp.json().get("version"))
    except (httpx.HTTPError, ValueError):
        pass
    return None
