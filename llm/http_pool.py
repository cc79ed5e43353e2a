"""httpcore's connection pool, kept from closing a connection a request holds.

httpcore's pool (httpcore 1.0.9; encode/httpcore#1110, open upstream) hands an idle
connection to a waiting request, and the connection stays idle until that request's
thread wakes and starts it. Another thread's pass over the pool meanwhile sees a surplus
idle connection (more than ``max_keepalive_connections``, 20 by default in httpx), or one
to close to make room for another origin, and closes it. If the first request has begun
by then, its socket is closed under it; its ``poll`` is not woken by the close, so the
call waits out its whole read timeout and then fails with EBADF. In the broker, whose
worker threads share litellm's one httpx client, that was a model call held for 120 s
(the default ``timeout_s``) at 100 sessions, about one call in a few thousand, then
retried. A stand-alone run of 8,000 posts from 200 threads to the fake model hung or
failed 1 to 3 of them per run before this, none after.

``install`` replaces the pool's housekeeping with the same code that leaves alone every
connection a request in the pool holds; it runs in every process that shares an httpx
client between threads (the broker, a remote runtime's driver).
A later httpcore whose housekeeping changed keeps its own (a logged line says so).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from typing import Any

from httpcore._sync.connection_pool import ConnectionPool

logger = logging.getLogger(__name__)

_UPSTREAM_SHA256 = "4e09ebf79b6273ade02b26675490d2be6afc3b002b8694f0959fef7bb93152f3"
"""sha256 of ``ConnectionPool._assign_requests_to_connections`` in httpcore 1.0.9."""


def _assign_requests_to_connections(self: Any) -> list[Any]:
    """httpcore 1.0.9's, except that a connection some request holds is never closed."""
    held = {id(r.connection) for r in self._requests if r.connection is not None}
    closing = []
    for connection in list(self._connections):
        if connection.is_closed():
            self._connections.remove(connection)
        elif id(connection) in held:
            continue  # a request starts, or runs, on it: closing it closes its socket
        elif connection.has_expired():
            self._connections.remove(connection)
            closing.append(connection)
        elif connection.is_idle() and len(self._connections) > self._max_keepalive_connections:
            self._connections.remove(connection)
            closing.append(connection)

    for pool_request in [r for r in self._requests if r.is_queued()]:
        origin = pool_request.request.url.origin
        available = [c for c in self._connections
                     if c.can_handle_request(origin) and c.is_available()]
        idle = [c for c in self._connections if c.is_idle() and id(c) not in held]
        if available:
            connection = available[0]
        elif len(self._connections) < self._max_connections:
            connection = self.create_connection(origin)
            self._connections.append(connection)
        elif idle:
            self._connections.remove(idle[0])
            closing.append(idle[0])
            connection = self.create_connection(origin)
            self._connections.append(connection)
        else:
            continue
        pool_request.assign_to_connection(connection)
        held.add(id(connection))
    return closing


KEPT_CONNECTIONS = 512
"""Connections a pool may hold, and keep alive between calls: the broker's worker threads
(``LLMBroker.max_workers``), so its pool neither queues a call the admission gates let
through nor closes a connection only to open another for the next call."""

_original_init = ConnectionPool.__init__


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    self._max_connections = max(self._max_connections, KEPT_CONNECTIONS)
    self._max_keepalive_connections = max(self._max_keepalive_connections, KEPT_CONNECTIONS)


def install() -> bool:
    """Patch httpcore's pools in this process (idempotent): spare the connections requests
    hold, and keep up to ``KEPT_CONNECTIONS`` alive. False, changing nothing, when the
    installed httpcore's housekeeping is not the one this replaces."""
    current = ConnectionPool._assign_requests_to_connections
    if current is _assign_requests_to_connections:
        return True
    digest = hashlib.sha256(inspect.getsource(current).encode()).hexdigest()
    if digest != _UPSTREAM_SHA256:
        logger.info("httpcore's pool housekeeping changed; it is kept as it is")
        return False
    ConnectionPool._assign_requests_to_connections = _assign_requests_to_connections  # type: ignore[method-assign]
    ConnectionPool.__init__ = _init  # type: ignore[method-assign]
    return True
