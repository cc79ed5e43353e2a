"""SQLite connections for the event store: per thread, per process, and safe across fork.

Connections: one per thread per process, opened lazily and kept in a dict keyed by the
thread (guarded by a lock), so readers in one thread never wait on a writer in another.
Thespian forks actor processes, and an SQLite connection must never be used across a
``fork()``: after one, the child forgets every connection it inherited (they are kept
referenced, never used and never closed, so closing them cannot disturb the parent) and
opens its own. An ``os.register_at_fork`` hook does this right after the fork, and a pid
check on every call is the fallback for a fork that skipped the hook.

SQLite's locks are POSIX locks, owned by the process: two rules keep them real. Nothing
in a process opens and closes a descriptor of its own on the database while a connection
is open (closing any descriptor of a file drops all the process's locks on it; see
``files.make_private``). And a process should hold no connection when it forks actors:
SQLite's table of open files survives the fork, so a connection the child opens reuses
the inherited entry and never takes locks of its own (``Trouper`` opens its actor system
before its connection; ``tests/test_store_locks.py`` reads the locks in /proc/locks).
Broken, either rule let a writer overwrite another's commits in the WAL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from ..exceptions import InvalidRequest, StoreError
from ..home.paths import private_dir
from .files import make_private

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Kept in ``PRAGMA user_version``; a database with a higher one is refused."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    config_json TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    state_reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    action_id TEXT,
    ts TEXT NOT NULL,
    body_json TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_by_action ON events (session_id, action_id)
    WHERE action_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS session_meta (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
) WITHOUT ROWID;
"""

_STORES: weakref.WeakSet[SQLiteConnections] = weakref.WeakSet()
_INHERITED: list[sqlite3.Connection] = []
"""Connections a forked child inherited: referenced forever so they are never closed."""


def _forget_after_fork() -> None:
    for store in list(_STORES):
        store._forget_connections()


os.register_at_fork(after_in_child=_forget_after_fork)



class SQLiteConnections:
    """One SQLite file: a connection per thread, made afresh after a fork, on a checked
    schema. ``SQLiteEventStore`` builds the log on it."""

    def __init__(
        self,
        path: Path | str,
        *,
        synchronous: Literal["normal", "full"] = "normal",
        busy_timeout_s: float = 30.0,
    ) -> None:
        if synchronous not in ("normal", "full"):
            raise InvalidRequest(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        self.path = Path(path)
        """The database file (its ``-wal`` and ``-shm`` files sit beside it)."""
        self._synchronous = synchronous.upper()
        self._busy_timeout_s = busy_timeout_s
        self._closed = False
        try:
            make_private(self.path)
        except OSError as e:
            raise StoreError(f"cannot open the event store {self.path}: {e}") from e
        self._forget_connections()
        _STORES.add(self)
        self._conn()  # create or check the schema now, so a bad file fails here

    # ---- connections -------------------------------------------------------------

    def _forget_connections(self) -> None:
        """Start afresh in this process: inherited connections are kept, never used."""
        _INHERITED.extend(getattr(self, "_conns", {}).values())
        _INHERITED.extend(getattr(self, "_followers", set()))
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._conns: dict[threading.Thread, sqlite3.Connection] = {}
        self._followers: set[sqlite3.Connection] = set()

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        if self._closed:
            raise StoreError(f"the event store {self.path} is closed")
        if self._pid != os.getpid():
            self._forget_connections()
        thread = threading.current_thread()
        conn = self._conns.get(thread)
        if conn is None:
            conn = self._open()
            with self._lock:
                self._prune_dead_threads()
                self._conns[thread] = conn
        return conn

    def _prune_dead_threads(self) -> None:
        for thread in [t for t in self._conns if not t.is_alive()]:
            self._conns.pop(thread).close()

    def _open(self) -> sqlite3.Connection:
        """A new connection (autocommit: transactions are explicit) on a checked schema."""
        try:
            private_dir(self.path.parent)
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open the event store {self.path}: {e}") from e
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
            self._ensure_schema(conn)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the event store {self.path}: {e}") from e

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the event store {self.path} has schema version {version}, newer than the "
                f"{SCHEMA_VERSION} this trouper knows: upgrade trouper to open it"
            )
        if version == SCHEMA_VERSION:
            return
        self._set_wal(conn)
        with immediate(conn):
            if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        logger.info("event store %s: schema version %d", self.path, SCHEMA_VERSION)

    def _set_wal(self, conn: sqlite3.Connection) -> None:
        """Switch to WAL (persistent in the file); retry while another opener holds it."""
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
                continue
            if mode.lower() != "wal":
                raise StoreError(f"the event store {self.path} cannot use WAL mode ({mode})")
            return

    def close(self) -> None:
        """Close every connection this process opened. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._pid != os.getpid():
                return  # a forked child never closes what it inherited
            for conn in [*self._conns.values(), *self._followers]:
                conn.close()
            self._conns.clear()
            self._followers.clear()
        _STORES.discard(self)

    # ---- sessions ----------------------------------------------------------------


    def _open_follower(self) -> sqlite3.Connection:
        self._conn()  # the closed and fork checks
        conn = self._open()
        with self._lock:
            self._followers.add(conn)
        return conn

    def _close_follower(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if conn in self._followers and self._pid == os.getpid():
                self._followers.discard(conn)
                conn.close()



@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; ``ROLLBACK`` on any exception, COMMIT's included."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
