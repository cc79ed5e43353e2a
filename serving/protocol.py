"""uvicorn's h11 protocol with a door: connections per client address and in all, and
deadlines on reading a request.

uvicorn bounds an idle connection only between two requests (``timeout_keep_alive``, and
the first byte cancels it), and has no deadline on a request's headers or body: a client
that opens connections and sends nothing, or one byte every few seconds, holds each for
good. Here every connection, from its opening, is in one of four phases:

    head   waiting for a request's line and headers: they must all arrive within
           ``header_timeout_s`` (from the connection's opening, or from the first byte
           after the previous answer)
    body   the headers came and a body is due: it must keep arriving, at least
           ``min_body_bytes_per_s`` on average once ``body_timeout_s`` has passed
    app    the request is read; the app answers in its own time (a long-poll, a stream)
    idle   answered; uvicorn's keep-alive timeout closes the connection if nothing comes

A connection past its deadline is closed (the app, if it was reading, is told the client
left). A connection over ``max_connections`` or ``max_connections_per_client`` is
answered 503 and closed before anything is read. Each kind of trouble is logged at most
once a minute per address (``Notes``). A WebSocket handed over to uvicorn's WebSocket
protocol keeps its slot until it closes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .asgi import ErrorBody
from .limits import HttpLimits, Notes

logger = logging.getLogger(__name__)

_QUIET = frozenset({"Invalid HTTP request received.",
                    "ASGI callable returned without completing handshake."})
"""uvicorn's own lines for each malformed request (``Notes`` logs those instead), and for
each WebSocket handshake refused with an HTTP answer (a 401, a 404: uvicorn 0.54's
websockets-sansio counts that answer as no handshake). A client could fill the log with
either, one line a request."""


class Door:
    """The connections one server holds, by client address (used on the loop's thread)."""

    def __init__(self, limits: HttpLimits, error_body: ErrorBody, notes: Notes) -> None:
        self.limits = limits
        self.notes = notes
        self.error_body = error_body
        self.open = 0
        self._by_host: dict[str, int] = {}
        body = error_body(503, "too many connections are open; retry later")
        self.refusal = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json"
                        b"\r\nconnection: close\r\nretry-after: 1\r\ncontent-length: "
                        + str(len(body)).encode() + b"\r\n\r\n" + body)
        """Written to a refused connection before it is closed (nothing of it is read)."""

    def admit(self, host: str) -> str | None:
        """Count a new connection from ``host`` in; else why it is refused."""
        limits = self.limits
        if self.open >= limits.max_connections:
            return f"{limits.max_connections} connections are open"
        if self._by_host.get(host, 0) >= limits.max_connections_per_client:
            return f"{limits.max_connections_per_client} connections from this address are open"
        self.open += 1
        self._by_host[host] = self._by_host.get(host, 0) + 1
        return None

    def release(self, host: str) -> None:
        self.open -= 1
        left = self._by_host.get(host, 1) - 1
        if left > 0:
            self._by_host[host] = left
        else:
            self._by_host.pop(host, None)

    def count(self, host: str) -> int:
        return self._by_host.get(host, 0)


def guarded_protocol(door: Door) -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for a server behind
    ``door``."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _Quiet) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_Quiet())
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"door": door})


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in _QUIET


class GuardedH11Protocol(H11Protocol):
    """See the module docstring; ``guarded_protocol`` makes one bound to a ``Door``."""

    door: ClassVar[Door]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._host = "?"
        self._admitted = False
        self._phase = "head"
        self._timer: asyncio.TimerHandle | None = None
        self._seen: object = None
        """The request cycle whose headers were last seen complete."""
        self._head_bytes = 0
        self._body_since = 0.0
        self._body_bytes = 0

    # -- the door ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        refusal = self.door.admit(host)
        if refusal is not None:
            self.door.notes.note("too many connections", host,
                                 f"{refusal}; answered 503 and closed this one unread")
            transport.write(self.door.refusal)
            transport.close()
            return
        self._host, self._admitted = host, True
        super().connection_made(transport)
        self._expect("head", self.door.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return  # refused at the door: uvicorn never knew of it
        self._cancel()
        self._release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if self._phase == "idle":  # the next request's first bytes
            self._expect("head", self.door.limits.header_timeout_s)
        if self._phase == "head":
            self._head_bytes += len(data)
        elif self._phase == "body":
            self._body_bytes += len(data)
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._phase != "body" or self.conn.their_state is not h11.SEND_BODY:
            self._cancel()
            self._phase = "idle"  # uvicorn's keep-alive timeout is armed now
        self._follow()  # a pipelined request may have begun

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._cancel()
        self._phase = "app"
        super().handle_websocket_upgrade(event)
        upgraded = self.transport.get_protocol()
        lost = upgraded.connection_lost

        def release_after(exc: Exception | None) -> None:
            try:
                lost(exc)
            finally:
                self._release()

        upgraded.connection_lost = release_after  # type: ignore[method-assign]

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what h11 cannot parse, in the server's JSON error shape."""
        limit = self.door.limits.max_header_bytes
        self.door.notes.note("invalid request", self._host,
                             f"malformed HTTP, or headers over {limit} bytes; answered 400")
        self._cancel()
        body = self.door.error_body(400, f"malformed HTTP (or headers over {limit} bytes)")
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def _release(self) -> None:
        if self._admitted:
            self._admitted = False
            self.door.release(self._host)

    # -- deadlines -----------------------------------------------------------------------

    def _follow(self) -> None:
        """Move to the phase the request cycle is in now."""
        cycle = self.cycle
        if cycle is None or cycle is self._seen and self._phase != "body":
            return
        if cycle is not self._seen:  # a request's headers are complete
            self._seen = cycle
            if self.conn.their_state is h11.SEND_BODY:
                self._body_since, self._body_bytes = self.loop.time(), 0
                self._expect("body", self.door.limits.body_timeout_s)
                return
        elif self.conn.their_state is h11.SEND_BODY:
            return
        self._cancel()
        self._phase = "idle" if cycle.response_complete else "app"

    def _expect(self, phase: str, within_s: float) -> None:
        self._cancel()
        self._phase = phase
        if phase == "head":
            self._head_bytes = 0
        self._timer = self.loop.call_later(within_s, self._expired)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        limits = self.door.limits
        if self._phase == "body":
            allowed = (self._body_since + limits.body_timeout_s
                       + self._body_bytes / limits.min_body_bytes_per_s)
            if self.flow.read_paused or allowed > self.loop.time():
                # still coming at a fair rate, or the app is the one not reading
                self._timer = self.loop.call_at(max(allowed, self.loop.time() + 1),
                                                self._expired)
                return
            self.door.notes.note("slow request body", self._host, f"{self._body_bytes} "
                                 "bytes of a body came too slowly; closed the connection")
        elif self._phase == "head" and self._head_bytes:
            self.door.notes.note("slow request headers", self._host, "the headers did not "
                                 f"arrive within {limits.header_timeout_s:g} s; closed the "
                                 "connection")
        elif self._phase == "head":
            logger.debug("%s: a connection sent nothing for %g s; closed", self._host,
                         limits.header_timeout_s)
        else:
            return
        self.transport.close()
