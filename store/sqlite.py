"""The default event store: one embedded SQLite file in WAL mode.

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

Privacy (I7): the database is created owner-only (0600) before SQLite opens it, whatever
the umask, and SQLite gives its ``-wal`` and ``-shm`` files the database's mode; an
existing file with looser modes is tightened, and the log says so. What is written is
masked once more with every secret value this process knows (``masking.known_masker``):
the task and the whole config, and every event, so a caller that forgot to mask cannot
put a known secret on disk.

Durability: every append is one ``BEGIN IMMEDIATE`` transaction (writers queue on the
database's write lock, so two can never read the same last seq). With
``synchronous="normal"`` a commit survives the crash of any process (the case of I3);
``"full"`` also syncs the WAL on every commit, so it survives a power cut too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from ..config import SessionConfig
from ..exceptions import InvalidRequest, LeaseLost, StoreError, UnknownSession
from ..masking import known_masker
from ..messages.events import AgentState, Event, StateChanged, event_from_json
from ..paths import private_dir
from .base import SessionRecord
from .faults import storage_fault
from .files import make_private

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Kept in ``PRAGMA user_version``; a database with a higher one is refused."""
_FOLLOW_PAGE = 1000
"""Events ``follow`` reads per query."""
_MAX_POLL_S = 0.1
"""Cap on ``follow``'s backoff between checks while nothing is new."""

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
_OWNER_SQL = "SELECT value FROM session_meta WHERE session_id = ? AND key = 'owner'"
_SESSION_COLUMNS = "id, config_json, created_at, updated_at, last_seq, state, state_reason"

_STORES: weakref.WeakSet[SQLiteEventStore] = weakref.WeakSet()
_INHERITED: list[sqlite3.Connection] = []
"""Connections a forked child inherited: referenced forever so they are never closed."""


def _forget_after_fork() -> None:
    for store in list(_STORES):
        store._forget_connections()


os.register_at_fork(after_in_child=_forget_after_fork)


def _ts(dt: datetime) -> str:
    """A fixed-width UTC timestamp, so text order is time order."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _public_config_json(config: SessionConfig) -> str:
    """The config as stored: the API key is excluded explicitly; every other field is
    masked with the values this process knows (the task may quote a secret)."""
    return known_masker().mask_event(config).model_dump_json(exclude={"llm": {"api_key"}})


def _record(row: tuple[Any, ...]) -> SessionRecord:
    session_id, config_json, created_at, updated_at, last_seq, state, reason = row
    return SessionRecord(
        session_id=session_id,
        config=_stored_config(session_id, config_json),
        created_at=datetime.fromisoformat(created_at),
        updated_at=datetime.fromisoformat(updated_at),
        last_seq=last_seq,
        state=AgentState(state),
        state_reason=reason,
    )


def _stored_config(session_id: str, config_json: str) -> SessionConfig:
    """A stored config; a field an older trouper allowed and this one refuses (say
    ``no_output_timeout_s=0``) is reset to its default, with a warning, so an old store
    still opens."""
    try:
        return SessionConfig.model_validate_json(config_json)
    except ValidationError as first:
        data = json.loads(config_json)
        for error in first.errors():
            *parents, name = error["loc"]
            holder = data
            for key in parents:
                holder = holder.get(key, {}) if isinstance(holder, dict) else {}
            if isinstance(holder, dict) and holder.pop(name, None) is not None:
                logger.warning("session %s: stored %s is no longer valid (%s); using the "
                               "default", session_id, ".".join(map(str, error["loc"])),
                               error["msg"])
        return SessionConfig.model_validate(data)


class SQLiteEventStore:
    """The ``EventStore`` on one SQLite file in WAL mode.

    Example::

        store = SQLiteEventStore(tmp_path / "trouper.db")
        store.create_session("s1", config)
        [ev] = store.append("s1", [MessageEvent(source="user", text="hi")])
        assert ev.seq == 1 and store.read("s1") == [ev]
        store.close()
    """

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
        with _immediate(conn):
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

    def create_session(self, session_id: str, config: SessionConfig) -> SessionRecord:
        """Create an empty session in state LOADING; an existing id raises InvalidRequest."""
        if not session_id:
            raise InvalidRequest("a session id must not be empty")
        now = _ts(datetime.now(UTC))
        row = (session_id, _public_config_json(config), now, now, 0, AgentState.LOADING, "")
        try:
            self._conn().execute(
                f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?,?,?,?,?,?,?)", row
            )
        except sqlite3.IntegrityError as e:
            raise InvalidRequest(f"session {session_id!r} already exists") from e
        except sqlite3.Error as e:
            raise StoreError(f"cannot create session {session_id!r}: {e}") from e
        logger.info("session %s: created", session_id)
        return _record(row)

    def session(self, session_id: str) -> SessionRecord:
        """The session's record; an unknown id raises UnknownSession."""
        row = self._query_one(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
        )
        if row is None:
            raise UnknownSession(f"no session has the id {session_id!r}")
        return _record(row)

    def sessions(self) -> list[SessionRecord]:
        """Every session, newest first."""
        rows = self._query(
            f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY created_at DESC, rowid DESC", ()
        )
        return [_record(row) for row in rows]

    def last_seq(self, session_id: str) -> int:
        """The ``seq`` of the session's latest event; 0 when its log is empty."""
        return self._last_seq(self._conn(), session_id)

    # ---- events ------------------------------------------------------------------

    def append(
        self, session_id: str, events: Sequence[Event], *, owner: int | None = None
    ) -> list[Event]:
        """Append ``events`` after the session's last one, all or none (see EventStore)."""
        conn = self._conn()
        try:
            with _immediate(conn):
                last = self._last_seq(conn, session_id)
                if owner is not None:
                    self._check_owner(conn, session_id, owner)
                masker = known_masker()  # a no-op for events their writer masked already
                stamped = [masker.mask_event(e.model_copy(update={"seq": last + i}))
                           for i, e in enumerate(events, 1)]
                conn.executemany(
                    "INSERT INTO events (session_id, seq, kind, source, action_id, ts, body_json)"
                    " VALUES (?,?,?,?,?,?,?)",
                    (_event_row(session_id, e) for e in stamped),
                )
                self._move_pointer(conn, session_id, stamped, last)
        except (sqlite3.Error, OSError, ValueError) as e:
            # ValueError: an event that cannot be serialised (pydantic's error derives from it)
            fault = storage_fault(e)
            if fault is not None:  # where the store lives failed: a state for the session
                raise fault from e
            raise StoreError(f"cannot append to session {session_id!r}: {e}") from e
        return stamped

    def _move_pointer(
        self, conn: sqlite3.Connection, session_id: str, events: list[Event], last: int
    ) -> None:
        changes = [e for e in events if isinstance(e, StateChanged)]
        state = (changes[-1].state.value, changes[-1].reason) if changes else (None, None)
        conn.execute(
            "UPDATE sessions SET last_seq = ?, updated_at = ?,"
            " state = coalesce(?, state), state_reason = coalesce(?, state_reason)"
            " WHERE id = ?",
            (last + len(events), _ts(datetime.now(UTC)), *state, session_id),
        )

    def read(self, session_id: str, since: int = 0, limit: int | None = None) -> list[Event]:
        """Events with ``seq > since`` in order, at most ``limit`` of them (None: all)."""
        events = self._read(self._conn(), session_id, since, limit)
        if not events:
            self.last_seq(session_id)  # raises UnknownSession for an unknown id
        return events

    def _read(
        self, conn: sqlite3.Connection, session_id: str, since: int, limit: int | None
    ) -> list[Event]:
        rows = self._query(
            "SELECT body_json FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (session_id, since, -1 if limit is None else limit),
            conn,
        )
        return [event_from_json(body) for (body,) in rows]

    def follow(
        self,
        session_id: str,
        since: int = 0,
        *,
        timeout_s: float | None = None,
        poll_s: float = 0.02,
        stop: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Yield the events after ``since``, then new ones as any process appends them.

        An unknown session raises UnknownSession here, at the call. The iterator reads
        through its own connection, checking the cheap ``PRAGMA data_version`` before
        querying; while nothing is new it sleeps ``poll_s``, doubling up to 0.1 s.
        It ends when ``stop`` is set (checked before every event and while waiting),
        when the store is closed, or at the deadline ``timeout_s`` after this call:
        the deadline is checked before every read but the first, so the backlog's
        first page (up to 1000 events) is yielded even with ``timeout_s=0``.
        """
        self.last_seq(session_id)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self._follow(session_id, since, deadline, poll_s, stop or threading.Event())

    def _follow(
        self,
        session_id: str,
        since: int,
        deadline: float | None,
        poll_s: float,
        stop: threading.Event,
    ) -> Iterator[Event]:
        conn = self._open_follower()
        try:
            version, wait_s = None, poll_s
            while not (stop.is_set() or self._closed):
                current = conn.execute("PRAGMA data_version").fetchone()[0]
                batch = (
                    [] if current == version else self._read(conn, session_id, since, _FOLLOW_PAGE)
                )
                version = None if len(batch) == _FOLLOW_PAGE else current
                for event in batch:
                    if stop.is_set():
                        return
                    yield event
                    since, wait_s = event.seq, poll_s
                left_s = None if deadline is None else deadline - time.monotonic()
                if left_s is not None and left_s <= 0:
                    return
                if not batch:
                    stop.wait(wait_s if left_s is None else min(wait_s, left_s))
                    wait_s = min(wait_s * 2, max(poll_s, _MAX_POLL_S))
        except (sqlite3.Error, StoreError) as e:
            if not self._closed:  # closing the store under a follower ends it quietly
                raise StoreError(f"cannot follow session {session_id!r}: {e}") from e
        finally:
            self._close_follower(conn)

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

    # ---- ownership -----------------------------------------------------------------

    def claim_owner(self, session_id: str) -> int:
        """Become the session's one writer: a new, higher owner token (promise I3).

        Appends that pass an older token fail with LeaseLost from then on, so a Controller
        that lives on beside its replacement can never write into the log.
        """
        conn = self._conn()
        try:
            with _immediate(conn):
                self._last_seq(conn, session_id)
                row = self._query_one(_OWNER_SQL, (session_id,), conn)
                token = (int(row[0]) if row else 0) + 1
                conn.execute(
                    "INSERT INTO session_meta (session_id, key, value) VALUES (?, 'owner', ?)"
                    " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
                    (session_id, str(token)),
                )
        except sqlite3.Error as e:
            raise StoreError(f"cannot claim session {session_id!r}: {e}") from e
        return token

    def _check_owner(self, conn: sqlite3.Connection, session_id: str, owner: int) -> None:
        row = self._query_one(_OWNER_SQL, (session_id,), conn)
        current = int(row[0]) if row else 0
        if current != owner:
            raise LeaseLost(
                f"session {session_id!r} is now written by owner {current}, not {owner}"
            )

    # ---- meta --------------------------------------------------------------------

    def put_meta(self, session_id: str, key: str, value: str) -> None:
        """Set a small per-session value (owner leases and such)."""
        conn = self._conn()
        try:
            with _immediate(conn):
                self._last_seq(conn, session_id)
                conn.execute(
                    "INSERT INTO session_meta (session_id, key, value) VALUES (?,?,?)"
                    " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
                    (session_id, key, value),
                )
        except sqlite3.Error as e:
            raise StoreError(f"cannot set {key!r} of session {session_id!r}: {e}") from e

    def get_meta(self, session_id: str, key: str) -> str | None:
        """A per-session value, or ``None`` when ``key`` was never set."""
        row = self._query_one(
            "SELECT value FROM session_meta WHERE session_id = ? AND key = ?", (session_id, key)
        )
        if row is None:
            self.last_seq(session_id)  # raises UnknownSession for an unknown id
            return None
        return row[0]

    # ---- helpers -----------------------------------------------------------------

    def _last_seq(self, conn: sqlite3.Connection, session_id: str) -> int:
        row = self._query_one("SELECT last_seq FROM sessions WHERE id = ?", (session_id,), conn)
        if row is None:
            raise UnknownSession(f"no session has the id {session_id!r}")
        return row[0]

    def _query(
        self, sql: str, args: tuple[Any, ...], conn: sqlite3.Connection | None = None
    ) -> list[tuple[Any, ...]]:
        try:
            return (conn or self._conn()).execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise StoreError(f"the event store {self.path} failed: {e}") from e

    def _query_one(
        self, sql: str, args: tuple[Any, ...], conn: sqlite3.Connection | None = None
    ) -> tuple[Any, ...] | None:
        rows = self._query(sql, args, conn)
        return rows[0] if rows else None


def _event_row(session_id: str, e: Event) -> tuple[Any, ...]:
    action_id = getattr(e, "action_id", None)
    return (session_id, e.seq, e.kind, e.source, action_id, _ts(e.ts), e.model_dump_json())


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; ``ROLLBACK`` on any exception, COMMIT's included."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
