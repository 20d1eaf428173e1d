"""The API key in front of every route of a vLLM server, loaded into vLLM itself (`--middleware`).

vLLM checks `--api-key` / VLLM_API_KEY only for paths under /v1, so the same server answers
/tokenize, /pooling, /invocations (which generates text) and the rest to anyone. This ASGI middleware
wraps the whole app: every HTTP or WebSocket request needs `Authorization: Bearer <key>` except the
liveness probe (`OPEN_PATHS`, what Docker's healthcheck and `sparkctl status` call, and which answers
nothing but 200). The key is read from the same environment variable vLLM reads, so it is never an
argument of any process.

vLLM imports this module inside the engine's Python (the image installs sparkctl; the native runtime
runs the engine from sparkctl's own environment), so it imports nothing but the standard library.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# `python -m vllm...api_server --middleware sparkctl.server.keygate.KeyGate`
IMPORT_PATH = "sparkctl.server.keygate.KeyGate"
KEY_ENV = "VLLM_API_KEY"
OPEN_PATHS = frozenset({"/health"})


class KeyGate:
    """Refuse (401) every request without the key, on every path but OPEN_PATHS; no key set: let all in."""

    def __init__(self, app: App) -> None:
        self.app = app
        key = os.environ.get(KEY_ENV, "").strip()
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan events; or a server started without a key
            return
        method = scope.get("method", "GET")
        if method == "OPTIONS" or (scope.get("path", "") in OPEN_PATHS and method in ("GET", "HEAD")):
            await self.app(scope, receive, send)  # a CORS preflight carries no credentials by design
            return
        given = b""
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                given = b"Bearer " + token.strip() if scheme.lower() == b"bearer" else b""
                break
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(
            {"error": {"message": "invalid or missing API key", "type": "unauthorized"}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
