"""The runtime server's door: a bearer token on every request, checked before any body.

``Guard`` is the door both of trouper's servers use (``serving.token_guard.TokenGuard``,
plain ASGI, outside FastAPI): it reads the ``Authorization`` header from the request's
scope and compares it in constant time with the server's token; a request without the
right one gets 401 ``{"error": "Unauthorized", "message"}`` and ``Connection: close`` at
once, and its body is never read (``receive`` is never called). Then
``serving.asgi.RequestLimits``: a header block over ``max_header_bytes`` gets 431, a body
declared larger than ``max_body_bytes`` 413, both the same way, unread; one that turns
out larger while it is read (chunked) is cut at the limit with 413. Only HTTP is served:
a websocket is closed.
"""

from __future__ import annotations

import json
import logging

from ...serving.asgi import RequestLimits
from ...serving.limits import Notes
from ...serving.token_guard import ASGIApp, Refusal, TokenGuard

logger = logging.getLogger(__name__)

LIMIT_CODES = {400: "BadRequest", 401: "Unauthorized", 413: "PayloadTooLarge",
               431: "HeadersTooLarge", 503: "TooManyConnections"}
"""The error name of each refusal made at the door: the token, a request's size, its
connection."""
MAX_HEADER_BYTES = 16 * 1024
"""The request line and headers of one request (a longer one is refused unread)."""


def limit_error_body(status: int, message: str) -> bytes:
    """The server's error body for a request or connection refused at the door."""
    return json.dumps({"error": LIMIT_CODES.get(status, "HTTP"), "message": message}).encode()


class Guard(TokenGuard):
    """Wraps an ASGI app: token first, sizes second, then the app (``app``)."""

    def __init__(self, app: ASGIApp, token: str, max_body_bytes: int,
                 max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        if not token:
            raise ValueError("the runtime server needs a non-empty token")
        notes = Notes(logger)
        sized = RequestLimits(app, max_body_bytes=max_body_bytes,
                              max_header_bytes=max_header_bytes,
                              error_body=limit_error_body, notes=notes)
        super().__init__(sized, token=token, render=_render, notes=notes, websockets=False)
        self.app = app
        """The app behind the door (FastAPI's: its ``routes`` list every endpoint)."""
        self.max_body_bytes = max_body_bytes


def _render(refusal: Refusal) -> bytes:
    return limit_error_body(refusal.status, refusal.message)
