"""The runtime server's door: a bearer token on every request, checked before any body.

``Guard`` is plain ASGI, outside FastAPI: it reads the ``Authorization`` header from the
request's scope and compares it in constant time with the server's token; a request
without the right one gets 401 and ``Connection: close`` at once, and its body is never
read (``receive`` is never called). Then ``serving.asgi.RequestLimits``: a header block
over ``max_header_bytes`` gets 431, a body declared larger than ``max_body_bytes`` 413,
both the same way, unread; one that turns out larger while it is read (chunked) is cut
at the limit with 413. Only HTTP is served: a websocket is closed.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ...serving.asgi import RequestLimits
from ...serving.limits import Notes

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger(__name__)

LIMIT_CODES = {400: "BadRequest", 413: "PayloadTooLarge", 431: "HeadersTooLarge",
               503: "TooManyConnections"}
"""The error name of each refusal made from a request's size or its connection."""
MAX_HEADER_BYTES = 16 * 1024
"""The request line and headers of one request (a longer one is refused unread)."""


def limit_error_body(status: int, message: str) -> bytes:
    """The server's error body for a request or connection refused by its limits."""
    return json.dumps({"error": LIMIT_CODES.get(status, "HTTP"), "message": message}).encode()


class Guard:
    """Wraps an ASGI app: token first, sizes second, then the app."""

    def __init__(self, app: ASGIApp, token: str, max_body_bytes: int,
                 max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        if not token:
            raise ValueError("the runtime server needs a non-empty token")
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self.max_body_bytes = max_body_bytes
        self.notes = Notes(logger)
        self._sized = RequestLimits(app, max_body_bytes=max_body_bytes,
                                    max_header_bytes=max_header_bytes,
                                    error_body=limit_error_body, notes=self.notes)
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
        given = b""
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                given = value
        if not hmac.compare_digest(given, self._expected):
            self.refused += 1
            client = scope.get("client")
            self.notes.note("unauthorized request", str(client[0]) if client else "?",
                            f"{scope.get('method')} {str(scope.get('path'))[:100]}, "
                            "refused with 401 unread")
            await _refuse(send, 401, "Unauthorized", "missing or wrong bearer token",
                          [(b"www-authenticate", b"Bearer")])
            return
        await self._sized(scope, receive, send)


async def _refuse(send: Send, status: int, code: str, message: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer from the headers alone, and close the connection: the body stays unread."""
    data = json.dumps({"error": code, "message": message}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(data)).encode()),
               (b"connection", b"close"), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
