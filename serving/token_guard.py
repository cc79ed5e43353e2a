"""``TokenGuard``: the door of trouper's HTTP servers (the daemon, the remote runtime
server): the bearer token, checked from the headers before anything reads the request.

ASGI middleware around the whole app, so a route added later is guarded without saying
so. On every HTTP request and WebSocket handshake, in order:

1. the server's own checks (``before``: the daemon's Host and Origin), each of which may
   refuse;
2. a path of ``public_paths`` (files that hold no data and no token) goes through;
3. ``Authorization: Bearer <token>`` (one such header; the scheme's case is free),
   compared with the server's token in constant time (``hmac.compare_digest``); where the
   server takes WebSockets (``subprotocol_prefix``), a handshake may offer the token as
   the subprotocol ``<prefix><token>`` instead (browsers cannot set its headers). Never a
   query parameter: URLs get logged.

A refusal is answered from the headers alone: ``receive`` is never called, so no byte of
a body is read, whatever its ``Content-Length`` says. An HTTP refusal carries
``Connection: close`` (the unread body cannot be skipped to reach a next request) and a
401 carries ``WWW-Authenticate: Bearer``; its JSON body is the server's own shape, made
by the ``render`` it gives. A WebSocket handshake gets the same answer where the server
supports one (``websocket.http.response``), else a close (1008); a server that serves no
WebSocket (``websockets=False``) closes every handshake at once. Each refusal is a
``Notes`` entry: logged at most once a minute per kind and address.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from .limits import Notes

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger(__name__)

READ_HEADERS = ("host", "origin", "authorization")
"""The headers a guard reads; a second copy of one makes it ambiguous (``DUPLICATE``)."""
DUPLICATE = "\0duplicate"
"""The value of a header sent twice: it matches no host, origin or token."""


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, before the server renders it in its own shape."""

    status: int
    kind: str
    """A short name of the reason (``unauthorized``, ``forbidden_host``): the daemon's
    error code, and what the log calls it."""
    message: str


Render = Callable[[Refusal], bytes]
"""The server's JSON error body for a refusal."""
Check = Callable[[Scope, dict[str, str]], Refusal | None]
"""A server's own check of a request's scope and headers (``READ_HEADERS``)."""


class TokenGuard:
    """The middleware; see the module docstring."""

    def __init__(self, app: ASGIApp, *, token: str, render: Render, notes: Notes | None = None,
                 message: str = "missing or wrong bearer token",
                 before: Iterable[Check] = (), public_paths: Iterable[str] = (),
                 websockets: bool = True, subprotocol_prefix: str | None = None) -> None:
        if not token:
            raise ValueError("a server's token must not be empty")
        self.inner = app
        """What a request that passes goes to."""
        self._token = token.encode()
        self.render = render
        self.notes = notes or Notes(logger)
        """Refusals, logged at most once a minute per kind and address (a client retrying
        with a wrong token is one line a minute, not one a request)."""
        self.unauthorized = Refusal(401, "unauthorized", message)
        self.before = tuple(before)
        self.public_paths = frozenset(public_paths)
        self.websockets = websockets
        self.subprotocol_prefix = subprotocol_prefix
        self.refused = 0
        """Requests refused so far (tests read it)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):  # lifespan
            await self.inner(scope, receive, send)
            return
        if kind == "websocket" and not self.websockets:
            await send({"type": "websocket.close", "code": 1008})
            return
        refusal = self.refusal(scope, header_values(scope))
        if refusal is None:
            await self.inner(scope, receive, send)
            return
        self.refused += 1
        client = scope.get("client")
        self.notes.note(f"{refusal.kind} request", str(client[0]) if client else "?",
                        f"{scope.get('method', 'WS')} {str(scope.get('path'))[:100]}: "
                        f"{refusal.status}, refused unread")
        await refuse(scope, send, refusal, self.render(refusal))

    def refusal(self, scope: Scope, headers: dict[str, str]) -> Refusal | None:
        """Why this request is refused; None when it may pass."""
        for check in self.before:
            refusal = check(scope, headers)
            if refusal is not None:
                return refusal
        if scope["type"] == "http" and scope.get("path") in self.public_paths:
            return None
        return None if self.has_token(scope, headers) else self.unauthorized

    def has_token(self, scope: Scope, headers: dict[str, str]) -> bool:
        """Whether the request carries the server's token."""
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.matches(given.strip()):
            return True
        prefix = self.subprotocol_prefix
        if scope["type"] == "websocket" and prefix:
            return any(offered.startswith(prefix) and self.matches(offered[len(prefix):])
                       for offered in scope.get("subprotocols") or ())
        return False

    def matches(self, given: str) -> bool:
        """``given`` is the token (compared in constant time)."""
        return bool(given) and hmac.compare_digest(_wire_bytes(given), self._token)


def header_values(scope: Scope) -> dict[str, str]:
    """The ``READ_HEADERS`` of a request, by lower-case name (``DUPLICATE`` if sent twice)."""
    out: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers") or ():
        name = raw_name.decode("latin-1").lower()
        if name in READ_HEADERS:
            out[name] = DUPLICATE if name in out else raw_value.decode("latin-1")
    return out


def _wire_bytes(text: str) -> bytes:
    """The bytes a header value came as (ASGI servers decode them as latin-1), so a token
    that is not ASCII compares as its UTF-8 bytes were sent."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode()


async def refuse(scope: Scope, send: Send, refusal: Refusal, body: bytes) -> None:
    """Answer ``refusal`` from the headers alone; the body of the request is never read."""
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="trouper"'))
    if scope["type"] == "http":
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": refusal.status,
                    "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send({"type": "websocket.http.response.start", "status": refusal.status,
                    "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008, "reason": refusal.kind})
