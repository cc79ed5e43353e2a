"""The runtime server's door: a bearer token on every request, checked before any body.

``Guard`` is plain ASGI, outside FastAPI: it reads the ``Authorization`` header from the
request's scope and compares it in constant time with the server's token; a request
without the right one gets 401 and ``Connection: close`` at once, and its body is never
read (``receive`` is never called). A body declared larger than ``max_body_bytes`` gets
413 the same way, and one that turns out larger while it is read (chunked) raises
``PayloadTooLarge`` (answered 413 by the app). Only HTTP is served: a websocket is closed.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class PayloadTooLarge(Exception):
    """A request body grew past the limit while it was read."""


class Guard:
    """Wraps an ASGI app: token first, size second, then the app."""

    def __init__(self, app: ASGIApp, token: str, max_body_bytes: int) -> None:
        if not token:
            raise ValueError("the runtime server needs a non-empty token")
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self.max_body_bytes = max_body_bytes
        self.refused = 0
        """Requests refused for a missing or wrong token (tests read it)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, receive, send)
            return
        if kind != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = scope.get("headers") or []
        given = b""
        length: bytes | None = None
        for name, value in headers:
            if name == b"authorization":
                given = value
            elif name == b"content-length":
                length = value
        if not hmac.compare_digest(given, self._expected):
            self.refused += 1
            await _refuse(send, 401, "Unauthorized", "missing or wrong bearer token",
                          [(b"www-authenticate", b"Bearer")])
            return
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await _refuse(send, 413, "PayloadTooLarge",
                          f"the body may hold at most {self.max_body_bytes} bytes")
            return
        await self.app(scope, self._counted(receive), send)

    def _counted(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise PayloadTooLarge(
                        f"the body may hold at most {self.max_body_bytes} bytes")
            return message

        return counted


async def _refuse(send: Send, status: int, code: str, message: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer from the headers alone, and close the connection: the body stays unread."""
    data = json.dumps({"error": code, "message": message}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(data)).encode()),
               (b"connection", b"close"), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
