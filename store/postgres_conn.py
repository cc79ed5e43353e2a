"""PostgreSQL connections for the event store: a small pool per process, safe across fork.

The pool (``psycopg_pool.ConnectionPool``) opens on first use, after one direct connection
has checked the schema (``postgres_schema.ensure_schema``), so a bad URL, a server that
does not answer or a wrong password fails the first call with the server's reason.
Connections are autocommit; a transaction is explicit (``conn.transaction()``). A pooled
connection is checked as it is handed out, so one the server dropped (a restart, an idle
timeout) is replaced rather than failing the call.

Thespian forks actor processes, and a libpq connection must never be used by two
processes: closing one in the child would also say goodbye on the parent's socket. After
a fork the child points every socket it inherited from a store at ``/dev/null`` (what
``actors.forking.release_inherited_descriptors`` does for an actor anyway), keeps the
objects referenced and never uses them, and opens its own pool on first use.

Secrets (I7 in docs/promises.md): the URL's password is never in a message, a log line or
``repr``; ``where`` (user, host, port, database) names the store instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from ..exceptions import InvalidRequest, StoreError, StoreUnavailable, UnknownSession
from .postgres_listen import Listener
from .postgres_schema import ensure_schema

logger = logging.getLogger(__name__)

_STORES: weakref.WeakSet[PostgresConnections] = weakref.WeakSet()
_INHERITED: list[Any] = []
"""Pools and connections a forked child inherited: referenced forever, never used."""
_RETIRED: list[ConnectionPool] = []
"""Pools replaced after an outage, while they close in the background."""
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
               "keepalives_count": 3, "tcp_user_timeout": 10_000}
"""A server that vanished (a host down, a partition) is noticed in ~25 s, not hours: by
the keepalives while a connection waits for an answer, by ``tcp_user_timeout`` (ms) while
what it sent is not acknowledged (a partition that swallows packets)."""

_SESSION_OPTIONS = {"options": "-c default_transaction_isolation=read\\ committed"
                               " -c idle_in_transaction_session_timeout=5000"
                               " -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5"
                               " -c tcp_keepalives_count=3"}
"""Set on every connection. READ COMMITTED: the owner fence reads the owner after the row
lock is granted, which only READ COMMITTED sees fresh (a database or role set to
REPEATABLE READ would let a superseded owner append). The server's own timeouts: a
writer cut off in the middle of an append (a partition) leaves its backend idle in its
transaction, holding the session's row lock, and no other host could claim the session
until the server noticed; the server now ends such a backend after 5 s, and notices a
vanished client in ~25 s."""


def _forget_after_fork() -> None:
    for store in list(_STORES):
        store._forget_connections(inherited=True)


os.register_at_fork(after_in_child=_forget_after_fork)


def _retire(pool: ConnectionPool) -> None:
    try:
        pool.close(timeout=5.0)
    finally:
        _RETIRED.remove(pool)


def describe(url: str) -> tuple[dict[str, Any], str, str]:
    """(libpq parameters, where, password) of a ``postgresql://`` URL; ``where`` is
    ``postgresql://user@host:port/dbname``, without the password."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as e:
        raise StoreError(f"not a PostgreSQL URL: {_redacted(str(e), _password_in(url))}"
                         " (expected postgresql://user:password@host:port/database)") from None
    password = str(params.get("password") or "")
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = str(params.get("port") or "5432")
    user = params.get("user")
    where = (f"postgresql://{quote(str(user)) + '@' if user else ''}{host}:{port}/"
             f"{params.get('dbname') or ''}")
    return params, where, password


def _password_in(url: str) -> str:
    head = url.split("@", 1)[0] if "@" in url else ""
    return head.rsplit(":", 1)[1] if head.count(":") >= 2 else ""


def _redacted(text: str, password: str) -> str:
    if password:
        for form in {password, quote(password, safe="")}:
            text = text.replace(form, "***")
    return text


class PostgresConnections:
    """One PostgreSQL database: a pool per process, made afresh after a fork, on a checked
    schema. ``PostgresEventStore`` builds the log on it."""

    def __init__(self, url: str, *, pool_size: int = 4, timeout_s: float = 10.0,
                 channel: str = "trouper_events") -> None:
        """``pool_size``: connections this process keeps at most (one more listens while
        any ``follow`` runs: ``store/postgres_listen.py``);
        ``timeout_s``: how long a call waits for a connection before StoreUnavailable."""
        if pool_size < 1 or timeout_s <= 0:
            raise InvalidRequest("pool_size must be at least 1 and timeout_s above 0")
        self._params, self.where, self._password = describe(url)
        self._pool_size = pool_size
        self._timeout_s = timeout_s
        self.channel = channel
        """The NOTIFY channel of this store's appends (one per database)."""
        self._closed = False
        self._forget_connections(inherited=False)
        _STORES.add(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r})"

    # ---- connections -------------------------------------------------------------

    def _forget_connections(self, *, inherited: bool) -> None:
        """Start afresh in this process; what a fork left is kept, muted and never used."""
        if inherited:
            devnull = os.open(os.devnull, os.O_RDWR)
            try:
                for conn in list(self._conns):
                    with contextlib.suppress(Exception):
                        os.dup2(devnull, conn.pgconn.socket)
            finally:
                os.close(devnull)
            _INHERITED.extend([self._pool, *self._conns])
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._listener: Listener | None = None
        self._conns: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()

    def _kwargs(self) -> dict[str, Any]:
        return {**_KEEPALIVES, "application_name": "trouper", **self._params,
                **_SESSION_OPTIONS,
                "connect_timeout": max(1, round(self._timeout_s)), "autocommit": True}

    def connect(self, *, role: str = "") -> psycopg.Connection:
        """A new connection of this process (not pooled); the caller closes it. ``role``
        is appended to its ``application_name`` (``trouper-listen``: the listener)."""
        self._check_open()
        kwargs = self._kwargs()
        if role:
            kwargs["application_name"] = f"{kwargs['application_name']}-{role}"
        try:
            conn = psycopg.connect(**kwargs)
        except psycopg.Error as e:
            raise self.fault(e, "connect to") from e
        self._conns.add(conn)
        return conn

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the event store {self.where} is closed")
        if self._pid != os.getpid():
            self._forget_connections(inherited=True)

    def _pool_(self) -> ConnectionPool:
        self._check_open()
        with self._lock:
            if self._pool is None:
                with self.connect() as conn:  # the server's own reason if it fails
                    try:
                        ensure_schema(conn, self.where)
                    except psycopg.Error as e:
                        raise self.fault(e, "prepare the schema of") from e
                kwargs = self._kwargs()
                pool = ConnectionPool(
                    "", kwargs=kwargs, min_size=1, max_size=self._pool_size, open=False,
                    name=f"trouper-store-{os.getpid()}", timeout=self._timeout_s,
                    check=ConnectionPool.check_connection, configure=self._conns.add,
                    reconnect_timeout=max(60.0, self._timeout_s))
                pool.open(wait=False)
                self._pool = pool
            return self._pool

    def listener(self) -> Listener:
        """This process's one listening side of the store, shared by its followers."""
        self._check_open()
        with self._lock:
            if self._listener is None:
                self._listener = Listener(lambda: self.connect(role="listen"), self.channel,
                                          self.where)
            return self._listener

    @contextlib.contextmanager
    def pooled(self, what: str) -> Iterator[psycopg.Connection]:
        """A pooled connection; a backend failure raised inside becomes StoreUnavailable or
        StoreError (``what`` says what was being done), the cause chained.

        With none free within the timeout, a direct try says why: the server's reason as
        StoreUnavailable, or, when the server answers again while the pool still waits out
        its backoff from an outage, this call runs on that connection and the pool is made
        afresh (without it, calls failed for seconds after the server came back).
        """
        pool = self._pool_()
        try:
            try:
                conn, pooled = pool.getconn(), True
            except PoolTimeout as e:
                conn, pooled = self._direct(e, what, pool), False
            try:
                yield conn
            finally:
                if pooled:
                    pool.putconn(conn)
                else:
                    conn.close()
        except psycopg.Error as e:
            if self._closed:
                raise StoreError(f"the event store {self.where} is closed") from e
            raise self.fault(e, what) from e

    def _direct(self, e: PoolTimeout, what: str, pool: ConnectionPool) -> psycopg.Connection:
        try:
            conn = psycopg.connect(**{**self._kwargs(), "connect_timeout": 2})
        except psycopg.Error as direct:
            raise StoreUnavailable(f"cannot {what} the PostgreSQL server at {self.where}: "
                                   f"{self._text(direct)}", "unreachable") from e
        self._conns.add(conn)
        with self._lock:
            if self._pool is pool and not self._closed:
                self._pool = None  # the next call opens a new one, which connects at once
                _RETIRED.append(pool)
                threading.Thread(target=_retire, args=(pool,), daemon=True).start()
        return conn

    def fault(self, e: psycopg.Error, what: str) -> StoreError:
        """What a psycopg error amounts to: StoreUnavailable when where the store lives
        failed (a write may go through later), StoreError otherwise."""
        state = e.sqlstate or ""
        text = self._text(e)
        where = f"cannot {what} the event store {self.where}: {text}"
        low = text.lower()
        if state.startswith("28") or "authentication failed" in low or "pg_hba.conf" in low:
            return StoreError(f"{where} (check the user and password of the store URL)")
        if state == "3D000":
            return StoreError(f"{where} (create the database first)")
        if state == "53100":
            return StoreUnavailable(f"the disk of the PostgreSQL server is full ({where})",
                                    "full")
        if state == "25006":
            return StoreUnavailable(f"the PostgreSQL server is read-only ({where})",
                                    "read_only")
        if state in ("55P03", "40P01", "40001"):
            return StoreUnavailable(f"the store is locked by another writer ({where})",
                                    "locked")
        if (isinstance(e, psycopg.OperationalError | psycopg.InterfaceError)
                or state.startswith(("08", "57P", "53"))):
            return StoreUnavailable(f"the PostgreSQL server does not answer ({where})",
                                    "unreachable")
        return StoreError(where)

    def _text(self, e: BaseException) -> str:
        return _redacted(str(e).strip().replace("\n", " "), self._password)

    def close(self) -> None:
        """Close this process's listener and pool; waiting followers end at once. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
            listener, self._listener = self._listener, None
        if self._pid == os.getpid():
            if listener is not None:
                listener.close()
            if pool is not None:
                pool.close(timeout=5.0)
        _STORES.discard(self)

    @property
    def closed(self) -> bool:
        return self._closed


def unknown(session_id: str) -> UnknownSession:
    return UnknownSession(f"no session has the id {session_id!r}")
