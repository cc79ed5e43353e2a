"""``RequestLimits``: ASGI middleware refusing what a request's headers show is too large,
before a byte of its body is read, and cutting a body that grows too large as it is read.

It sits inside the server's own door (the token is checked first) and around the app:

- a request line and headers over ``max_header_bytes``: 431 (the protocol refuses a
  block that never ends; this catches one that arrived whole in one read);
- a ``Content-Length`` that is not one number: 400; over ``max_body_bytes``: 413. Both
  are answered from the headers with ``Connection: close``, and the body is never read;
- a body without a length (chunked) is counted as the app reads it: past the limit the
  client gets 413 and the connection is closed, and the app is told the client left
  (``http.disconnect``), so it stops reading; what it answers after that is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .limits import Notes

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ErrorBody = Callable[[int, str], bytes]
"""The server's JSON error body for an HTTP status and a message (each server has its own
error shape and codes)."""

logger = logging.getLogger(__name__)


class RequestLimits:
    """The middleware; see the module docstring."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_header_bytes: int,
                 error_body: ErrorBody, notes: Notes | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.error_body = error_body
        self.notes = notes or Notes(logger)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            status, kind, message = refusal
            self.notes.note(kind, _host(scope), f"{scope.get('method', 'GET')} "
                            f"{str(scope.get('path'))[:100]}: {message}; refused unread")
            if scope["type"] == "websocket":  # before the accept: the handshake fails
                await send({"type": "websocket.close", "code": 1009, "reason": kind})
            else:
                await _answer(send, status, self.error_body(status, message))
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        await _Counted(self, scope, receive, send).run()

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        headers = scope.get("headers") or []
        head = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + sum(
            len(name) + len(value) + 4 for name, value in headers)
        if head > self.max_header_bytes:
            return (431, "headers too large",
                    f"the request line and headers hold {head} bytes; the limit is "
                    f"{self.max_header_bytes}")
        lengths = {value.strip() for name, value in headers if name.lower() == b"content-length"}
        if not lengths:
            return None
        text = lengths.pop()
        if lengths or not (text.isdigit() and text.isascii()):
            return 400, "invalid content-length", "Content-Length must be one whole number"
        if int(text) > self.max_body_bytes:
            return (413, "body too large", f"the body has {int(text)} bytes; the limit is "
                    f"{self.max_body_bytes}")
        return None


class _Counted:
    """One request whose body is counted as the app reads it."""

    def __init__(self, limits: RequestLimits, scope: Scope, receive: Receive,
                 send: Send) -> None:
        self.limits, self.scope = limits, scope
        self._receive, self._send = receive, send
        self.seen = 0
        self.cut = False
        self.started = False

    async def run(self) -> None:
        try:
            await self.limits.app(self.scope, self.receive, self.send)
        except Exception:
            if not self.cut:
                raise
            # the app failed on the disconnect it was told of: the 413 is the answer
            logger.debug("after a body cut at the limit the app ended with", exc_info=True)

    async def receive(self) -> Message:
        if self.cut:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message.get("type") != "http.request":
            return message
        self.seen += len(message.get("body", b""))
        if self.seen <= self.limits.max_body_bytes:
            return message
        self.cut = True
        limit = self.limits.max_body_bytes
        self.limits.notes.note("body too large", _host(self.scope),
                               f"a body without a length passed {limit} bytes; cut")
        if not self.started:
            await _answer(self._send, 413, self.limits.error_body(
                413, f"the body passed the limit of {limit} bytes"))
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.cut:
            return  # the client has its 413; the app's late answer goes nowhere
        if message.get("type") == "http.response.start":
            self.started = True
        await self._send(message)


async def _answer(send: Send, status: int, body: bytes) -> None:
    """A JSON answer that closes the connection: whatever body follows is never read."""
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _host(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "?"
