"""Who may talk to the daemon: a bearer token on every route, and only through the
daemon's own Host and Origin.

``Guard`` is ASGI middleware around the whole app, so a route added later is guarded
without saying so; only ``PUBLIC_PATHS`` (the static web page, which holds no data and no
token) are served without the token. Checked, in order, on every HTTP request and every
WebSocket handshake:

1. ``Host`` must name the daemon's own address (``127.0.0.1:PORT``, ``localhost:PORT``,
   ``[::1]:PORT``, or the ``--host`` it was given): a DNS-rebinding page whose name now
   points at 127.0.0.1 sends its own name and is refused (403 ``forbidden_host``).
2. ``Origin``, when sent (browsers send it on cross-site requests and on every
   WebSocket), must be the daemon's own origin: a web page on another site cannot drive
   the daemon from the user's browser (403 ``forbidden_origin``).
3. The token: ``Authorization: Bearer <token>``; a WebSocket may instead offer the
   subprotocol ``bearer.<token>`` (browsers cannot set headers on a WebSocket). Never a
   query parameter: URLs get logged. Missing or wrong: 401 ``unauthorized``.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from ..serving.limits import Notes

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = frozenset({"/", "/page/app.js", "/page/style.css"})
"""Served without the token: the web page's static files (no data, no token in them)."""
SUBPROTOCOL = "trouper.v1"
"""The WebSocket subprotocol the daemon speaks (answered when the client offers it)."""
TOKEN_PROTOCOL_PREFIX = "bearer."
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    """The Host header values that name this daemon."""
    names = set(LOOPBACK_NAMES)
    if host not in ("127.0.0.1", "localhost", "::1"):
        names.add(f"[{host}]" if ":" in host else host)
    return frozenset(f"{name}:{port}" for name in names)


class Guard:
    """The middleware; see the module docstring."""

    def __init__(self, app: ASGIApp, *, token: str, hosts: Iterable[str]) -> None:
        self.app = app
        self._token = token.encode()
        self.hosts = frozenset(h.lower() for h in hosts)
        self.origins = frozenset(f"http://{h}" for h in self.hosts)
        self.notes = Notes(logger)
        """Refusals, logged at most once a minute per kind and address (a client
        retrying with a wrong token is one line a minute, not one a request)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, code, message = refusal
            client = scope.get("client")
            self.notes.note(f"refused ({code})", str(client[0]) if client else "?",
                            f"{scope['type']} {str(scope.get('path'))[:100]}: {status}")
            await _deny(scope, send, status, code, message)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, str] | None:
        host = headers.get("host", "").lower()
        if host not in self.hosts:
            return 403, "forbidden_host", "the Host header does not name this daemon"
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in self.origins:
            return 403, "forbidden_origin", "requests from another origin are refused"
        if scope["type"] == "http" and scope.get("path") in PUBLIC_PATHS:
            return None
        if not self._has_token(scope, headers):
            return 401, "unauthorized", "a valid bearer token is required (see docs/daemon.md)"
        return None

    def _has_token(self, scope: Scope, headers: dict[str, str]) -> bool:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self._matches(given.strip()):
            return True
        if scope["type"] == "websocket":
            for offered in scope.get("subprotocols") or ():
                if offered.startswith(TOKEN_PROTOCOL_PREFIX) and self._matches(
                        offered[len(TOKEN_PROTOCOL_PREFIX):]):
                    return True
        return False

    def _matches(self, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self._token)


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers") or ():
        name = raw_name.decode("latin-1").lower()
        if name in ("host", "origin", "authorization"):
            if name in out:  # two Host or Origin headers: ambiguous, treat as foreign
                out[name] = "\0duplicate"
                continue
            out[name] = raw_value.decode("latin-1")
    return out


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


LIMIT_CODES = {400: "bad_request", 413: "payload_too_large", 431: "headers_too_large",
               503: "too_many_connections"}
"""The error code of each refusal made from a request's size or its connection."""


def limit_error_body(status: int, message: str) -> bytes:
    """The daemon's error body for a request or connection refused by its limits."""
    return error_body(LIMIT_CODES.get(status, "http_error"), message)


async def _deny(scope: Scope, send: Send, status: int, code: str, message: str) -> None:
    body = error_body(code, message)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="trouper"'))
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008, "reason": code})  # 403 on the wire
