"""The live event streams: Server-Sent Events and a WebSocket, from a sequence number.

A stream of session S from seq N is one ``Subscription``: a thread follows S's log in the
store (``Session.events(N, follow=True)``: the backlog with seq > N, then every new event
as it is appended, from one cursor), so the replay and the live part are one read with no
seam to lose or repeat an event at. A client that reconnects from the last seq it got
(``Last-Event-ID``, ``?after=``) gets every later event exactly once, in order.

Flow control: the thread hands events to the connection through a buffer of at most
``buffer`` events, and waits while it is full (a replay goes at the client's pace). A
client that leaves it full for ``slow_client_s`` is too slow to keep up: the thread stops
reading, the connection sends what the buffer holds, then an ``end`` message with reason
``overflow`` and the seq to resume from, and closes. Nothing is dropped silently.

Ends of a stream (the ``end`` message's ``reason``): ``settled`` (with
``until_settled``: the session will not move without the user and its log is read),
``overflow``, ``closing`` (the daemon stops: reconnect once it is back), ``error``.
A dropped client only ends its subscription: the session never notices.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..client.session import Session
from ..messages.events import Event
from .service import event_json

logger = logging.getLogger(__name__)

HEARTBEAT = object()
"""``Subscription.next``'s value when nothing came for ``heartbeat_s``."""
WS_CLOSE_CODES = {"settled": 1000, "overflow": 1013, "closing": 1012, "error": 1011}
"""WebSocket close codes per end reason (1013: try again later; 1012: service restart)."""


@dataclass(frozen=True)
class StreamLimits:
    """``TROUPER_DAEMON_MAX_STREAMS``, ``TROUPER_DAEMON_STREAM_BUFFER``,
    ``TROUPER_DAEMON_SLOW_CLIENT_S``, ``TROUPER_DAEMON_HEARTBEAT_S`` override the
    defaults."""

    max_streams: int = 100
    buffer: int = 1000
    slow_client_s: float = 10.0
    heartbeat_s: float = 15.0

    @classmethod
    def from_env(cls) -> StreamLimits:
        env = os.environ
        return cls(
            max_streams=int(env.get("TROUPER_DAEMON_MAX_STREAMS") or cls.max_streams),
            buffer=int(env.get("TROUPER_DAEMON_STREAM_BUFFER") or cls.buffer),
            slow_client_s=float(env.get("TROUPER_DAEMON_SLOW_CLIENT_S") or cls.slow_client_s),
            heartbeat_s=float(env.get("TROUPER_DAEMON_HEARTBEAT_S") or cls.heartbeat_s))


@dataclass(frozen=True)
class End:
    """The last message of a stream."""

    reason: str
    after: int
    """The seq of the last event sent: reconnect from it to go on."""
    message: str = ""

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "end", "reason": self.reason, "after": self.after}
        if self.message:
            out["message"] = self.message
        return out


class Streams:
    """Every live stream of the daemon: the limit on their number, and closing them all."""

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        self.closing = threading.Event()
        self._open: set[Subscription] = set()
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self._open)

    def subscribe(self, session: Session, after: int, until_settled: bool,
                  loop: asyncio.AbstractEventLoop) -> Subscription | None:
        """A started subscription; None when ``max_streams`` are open (or closing)."""
        with self._lock:
            if self.closing.is_set() or len(self._open) >= self.limits.max_streams:
                return None
            sub = Subscription(self, session, after, until_settled, loop)
            self._open.add(sub)
        sub.start()
        return sub

    def forget(self, sub: Subscription) -> None:
        with self._lock:
            self._open.discard(sub)

    def close_all(self) -> None:
        """The daemon stops: every stream ends with reason ``closing``."""
        self.closing.set()
        with self._lock:
            subs = list(self._open)
        for sub in subs:
            sub.stop_following()


class Subscription:
    """One client's stream of one session from a seq (see the module docstring)."""

    def __init__(self, streams: Streams, session: Session, after: int, until_settled: bool,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.streams, self.session, self.after = streams, session, after
        self.until_settled = until_settled
        self._loop = loop
        self._stop = threading.Event()
        self._items: collections.deque[Event] = collections.deque()
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._wake = asyncio.Event()
        self._finished: End | None = None
        self._thread = threading.Thread(target=self._follow, daemon=True,
                                        name=f"stream-{session.id}")

    def start(self) -> None:
        self._thread.start()

    def stop_following(self) -> None:
        self._stop.set()
        with self._space:
            self._space.notify_all()

    def close(self) -> None:
        """The connection is done with it (ended, or the client went away)."""
        self.stop_following()
        self.streams.forget(self)

    def _follow(self) -> None:
        reason, message, read = "", "", self.after
        limits = self.streams.limits
        try:
            for event in self.session.events(self.after, follow=True,
                                             until_settled=self.until_settled,
                                             stop=self._stop):
                with self._space:  # wait while the buffer is full, for a while
                    self._space.wait_for(lambda: len(self._items) < limits.buffer
                                         or self._stop.is_set(), limits.slow_client_s)
                    if self._stop.is_set():
                        break
                    if len(self._items) >= limits.buffer:
                        reason = "overflow"
                        message = (f"the client did not keep up ({limits.buffer} events "
                                   f"waiting for {limits.slow_client_s:g} s); reconnect "
                                   f"from seq {read}")
                        break
                    self._items.append(event)
                    read = event.seq
                self._notify()
        except Exception as exc:  # noqa: BLE001 - the stream ends, saying why
            logger.exception("stream of session %s failed", self.session.id)
            reason, message = "error", f"the stream failed: {type(exc).__name__}"
        if reason == "overflow":
            logger.info("stream of session %s: the client did not keep up; it ends after "
                        "seq %d (overflow)", self.session.id, read)
        if not reason and self.streams.closing.is_set():
            reason, message = "closing", "the daemon is stopping; reconnect later"
        elif not reason:
            reason = "closed" if self._stop.is_set() else "settled"
        self._finished = End(reason, read, message)
        self._notify()

    def _notify(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
            self._loop.call_soon_threadsafe(self._wake.set)

    async def next(self, timeout_s: float) -> Event | End | object:
        """The next event; an ``End`` (its ``after`` the last seq handed out) when the
        stream is over; ``HEARTBEAT`` when nothing came for ``timeout_s``."""
        while True:
            self._wake.clear()
            finished = self._finished  # read first: every event it follows is queued
            with self._space:
                if self._items:
                    event = self._items.popleft()
                    self.after = event.seq
                    self._space.notify()
                    return event
            if finished is not None:
                return End(finished.reason, self.after, finished.message)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout_s)
            except TimeoutError:
                return HEARTBEAT


async def sse_lines(sub: Subscription) -> AsyncIterator[str]:
    """The SSE body: ``id: <seq>`` and the event as JSON, comments as heartbeats, and a
    last ``event: end`` (it carries no id: Last-Event-ID stays the last event's seq)."""
    try:
        yield f"retry: 1000\n: events of session {sub.session.id} after {sub.after}\n\n"
        while True:
            item = await sub.next(sub.streams.limits.heartbeat_s)
            if item is HEARTBEAT:
                yield ": ping\n\n"
            elif isinstance(item, End):
                yield f"event: end\ndata: {json.dumps(item.json())}\n\n"
                return
            else:
                data = json.dumps(event_json(item))  # type: ignore[arg-type]
                yield f"id: {item.seq}\ndata: {data}\n\n"  # type: ignore[union-attr]
    finally:
        sub.close()


async def ws_send_loop(sub: Subscription, send_json: Any) -> End:
    """Send the subscription's events as ``{"type": "event", "seq", "event"}`` messages,
    pings as ``{"type": "ping"}``, and the ``end`` message; return the End."""
    while True:
        item = await sub.next(sub.streams.limits.heartbeat_s)
        if item is HEARTBEAT:
            await send_json({"type": "ping", "after": sub.after})
        elif isinstance(item, End):
            await send_json(item.json())
            return item
        else:
            await send_json({"type": "event", "seq": item.seq,  # type: ignore[union-attr]
                             "event": event_json(item)})  # type: ignore[arg-type]
