"""httpcore's pool never closes a connection a request holds (``http_pool``).

Upstream (httpcore 1.0.9, encode/httpcore#1110): the pool hands an idle connection to a
waiting request, and the connection stays idle until that request's thread wakes and
starts it. Another thread's pass over the pool meanwhile sees a surplus idle connection,
or one to close to make room, and closes it: under a request already waiting for its
answer, whose ``poll`` is not woken, so the call hangs for its whole read timeout and
then fails with EBADF. The broker saw it at 100 sessions: one model call held for 120 s.
"""

from __future__ import annotations

import httpcore
from httpcore._sync.connection_pool import PoolRequest

from trouper.llm import http_pool


class FakeConnection:
    """What the pool asks of a connection, for one origin; idle until closed."""

    def __init__(self, origin: httpcore.Origin) -> None:
        self.origin = origin
        self.closed = False

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return origin == self.origin

    def is_available(self) -> bool:
        return not self.closed

    def has_expired(self) -> bool:
        return False

    def is_idle(self) -> bool:
        return not self.closed

    def is_closed(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _request(url: str = "http://127.0.0.1:9/v1") -> PoolRequest:
    return PoolRequest(httpcore.Request("POST", url))


def _limited(max_connections: int, max_keepalive_connections: int) -> httpcore.ConnectionPool:
    """A pool with these limits (set after ``install`` raised the defaults)."""
    http_pool.install()
    pool = httpcore.ConnectionPool()
    pool._max_connections = max_connections
    pool._max_keepalive_connections = max_keepalive_connections
    return pool


def _pool(**limits: int) -> tuple[httpcore.ConnectionPool, FakeConnection, PoolRequest]:
    """A pool holding one idle connection already handed to a request not yet started."""
    pool = _limited(**limits)
    held = _request()
    connection = FakeConnection(held.request.url.origin)
    pool._connections.append(connection)
    pool._requests.append(held)
    held.assign_to_connection(connection)
    return pool, connection, held


def test_a_held_connection_is_not_closed_as_surplus_keep_alive():
    pool, connection, _ = _pool(max_connections=10, max_keepalive_connections=0)
    closing = pool._assign_requests_to_connections()
    assert connection not in closing
    assert connection in pool._connections


def test_a_held_connection_is_not_closed_to_make_room_for_another_request():
    pool, connection, _ = _pool(max_connections=1, max_keepalive_connections=1)
    waiting = _request("http://127.0.0.2:9/v1")  # another origin: it cannot share the one
    pool._requests.append(waiting)
    closing = pool._assign_requests_to_connections()
    assert connection not in closing
    assert connection in pool._connections
    assert waiting.is_queued()  # it waits for a free slot, as at the limit it should


def test_an_idle_connection_nobody_holds_is_still_closed_as_before():
    pool = _limited(max_connections=10, max_keepalive_connections=0)
    free = FakeConnection(_request().request.url.origin)
    pool._connections.append(free)
    assert pool._assign_requests_to_connections() == [free]


def test_install_is_idempotent_and_reports_the_patch():
    assert http_pool.install() is True
    assert http_pool.install() is True


def test_the_broker_s_model_client_installs_it():
    from httpcore._sync.connection_pool import ConnectionPool

    import trouper.llm.client  # noqa: F401 - what the broker imports

    assert ConnectionPool._assign_requests_to_connections is (
        http_pool._assign_requests_to_connections)


def test_a_pool_keeps_as_many_connections_alive_as_the_broker_has_threads():
    """httpx's default keeps 20 of at most 100: with more calls in flight than 20, each
    connection a call freed was closed and the next call opened one (a TLS handshake
    against a provider); past 100 a call the gates admitted waited for a connection."""
    import httpx

    from trouper.actors.llm_broker import LLMBroker

    http_pool.install()
    pool = httpx.Client()._transport._pool  # type: ignore[attr-defined]
    assert pool._max_keepalive_connections >= LLMBroker.max_workers
    assert pool._max_connections >= LLMBroker.max_workers
    wider = httpcore.ConnectionPool(max_connections=4096, max_keepalive_connections=4096)
    assert wider._max_connections == 4096  # a larger limit is kept as it is
