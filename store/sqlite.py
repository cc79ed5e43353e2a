"""The default event store: one embedded SQLite file in WAL mode.

Connections, fork safety and SQLite's locks: ``store/sqlite_conn.py``.

Privacy (I7 in docs/promises.md): the database is created owner-only (0600) before
SQLite opens it, whatever
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

import logging
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from ..config.models import SessionConfig
from ..exceptions import InvalidRequest, LeaseLost, StoreError, UnknownSession
from ..messages.events import AgentState, Event, event_from_json
from ..observability.timing import timed_append
from .base import REPLACED_BY, SessionRecord
from .faults import storage_fault
from .serial import last_state, public_config_json, stamp, stored_config
from .sqlite_conn import SQLiteConnections, immediate

logger = logging.getLogger(__name__)

_FOLLOW_PAGE = 1000
"""Events ``follow`` reads per query."""
_MAX_POLL_S = 0.1
"""Cap on ``follow``'s backoff between checks while nothing is new."""
_OWNER_SQL = "SELECT value FROM session_meta WHERE session_id = ? AND key = 'owner'"
_SESSION_COLUMNS = "id, config_json, created_at, updated_at, last_seq, state, state_reason"
_REPLACED_BY = (f"(SELECT value FROM session_meta m WHERE m.session_id = sessions.id"
                f" AND m.key = '{REPLACED_BY}')")
_RECORD_COLUMNS = f"{_SESSION_COLUMNS}, {_REPLACED_BY}"
"""What ``_record`` reads: the row, and the session that replaced it (or NULL)."""
_NOT_REPLACED = f"NOT EXISTS {_REPLACED_BY}"


def _ts(dt: datetime) -> str:
    """A fixed-width UTC timestamp, so text order is time order."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(row: tuple[Any, ...]) -> SessionRecord:
    session_id, config_json, created_at, updated_at, last_seq, state, reason = row[:7]
    return SessionRecord(
        session_id=session_id,
        config=stored_config(session_id, config_json),
        created_at=datetime.fromisoformat(created_at),
        updated_at=datetime.fromisoformat(updated_at),
        last_seq=last_seq,
        state=AgentState(state),
        state_reason=reason,
        replaced_by=row[7] if len(row) > 7 else None,  # a row just inserted has none
    )


class SQLiteEventStore(SQLiteConnections):
    """The ``EventStore`` on one SQLite file in WAL mode.

    Example::

        store = SQLiteEventStore(tmp_path / "trouper.db")
        store.create_session("s1", config)
        [ev] = store.append("s1", [MessageEvent(source="user", text="hi")])
        assert ev.seq == 1 and store.read("s1") == [ev]
        store.close()
    """

    def create_session(self, session_id: str, config: SessionConfig,
                       events: Sequence[Event] = ()) -> SessionRecord:
        """Create a session in state LOADING, with ``events`` as its log in the same
        transaction (see EventStore); an existing id raises InvalidRequest."""
        if not session_id:
            raise InvalidRequest("a session id must not be empty")
        now = _ts(datetime.now(UTC))
        row = (session_id, public_config_json(config), now, now, 0, AgentState.LOADING, "")
        conn = self._conn()
        try:
            with immediate(conn):
                conn.execute(
                    f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?,?,?,?,?,?,?)", row)
                if events:
                    self._insert(conn, session_id, stamp(events, 0), 0)
        except sqlite3.IntegrityError as e:
            raise InvalidRequest(f"session {session_id!r} already exists") from e
        except (sqlite3.Error, ValueError) as e:
            raise StoreError(f"cannot create session {session_id!r}: {e}") from e
        logger.info("session %s: created", session_id)
        return self.session(session_id) if events else _record(row)

    def session(self, session_id: str) -> SessionRecord:
        """The session's record; an unknown id raises UnknownSession."""
        row = self._query_one(
            f"SELECT {_RECORD_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
        )
        if row is None:
            raise UnknownSession(f"no session has the id {session_id!r}")
        return _record(row)

    def sessions(self, *, replaced: bool = True) -> list[SessionRecord]:
        """Every session, newest first; the replaced ones left out without ``replaced``."""
        where = "" if replaced else f" WHERE {_NOT_REPLACED}"
        rows = self._query(
            f"SELECT {_RECORD_COLUMNS} FROM sessions{where}"
            " ORDER BY created_at DESC, rowid DESC", ()
        )
        return [_record(row) for row in rows]

    def last_seq(self, session_id: str) -> int:
        """The ``seq`` of the session's latest event; 0 when its log is empty."""
        return self._last_seq(self._conn(), session_id)

    def sessions_page(
        self, *, states: Collection[AgentState] | None = None, cursor: str | None = None,
        limit: int = 100, replaced: bool = True,
    ) -> tuple[list[SessionRecord], str | None]:
        """A page of sessions, newest first (see EventStore.sessions_page)."""
        where, args = ["1" if replaced else _NOT_REPLACED], []
        if states is not None and not states:
            return [], None
        if states is not None:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args += [AgentState(s).value for s in states]
        if cursor:
            created, _, rowid = cursor.rpartition("|")
            # ASCII digits that fit SQLite's 64-bit integer: a rowid past them failed the
            # query's binding (OverflowError), not the cursor
            if not created or not (rowid.isascii() and rowid.isdigit()) or len(rowid) > 18:
                raise InvalidRequest(f"not a cursor of this store: {cursor!r}")
            where.append("(created_at < ? OR (created_at = ? AND rowid < ?))")
            args += [created, created, int(rowid)]
        rows = self._query(
            f"SELECT {_RECORD_COLUMNS}, rowid FROM sessions WHERE {' AND '.join(where)}"
            " ORDER BY created_at DESC, rowid DESC LIMIT ?", (*args, max(1, limit) + 1))
        more = len(rows) > max(1, limit)
        rows = rows[:max(1, limit)]
        after = f"{rows[-1][2]}|{rows[-1][-1]}" if more else None
        return [_record(row[:-1]) for row in rows], after

    # ---- events ------------------------------------------------------------------

    @timed_append("sqlite")  # trouper_store_append_seconds (docs/operations.md)
    def append(
        self, session_id: str, events: Sequence[Event], *, owner: int | None = None
    ) -> list[Event]:
        """Append ``events`` after the session's last one, all or none (see EventStore)."""
        conn = self._conn()
        try:
            with immediate(conn):
                last = self._last_seq(conn, session_id)
                if owner is not None:
                    self._check_owner(conn, session_id, owner)
                stamped = stamp(events, last)
                self._insert(conn, session_id, stamped, last)
        except (sqlite3.Error, OSError, ValueError) as e:
            # ValueError: an event that cannot be serialised (pydantic's error derives from it)
            fault = storage_fault(e)
            if fault is not None:  # where the store lives failed: a state for the session
                raise fault from e
            raise StoreError(f"cannot append to session {session_id!r}: {e}") from e
        return stamped

    def _insert(self, conn: sqlite3.Connection, session_id: str, stamped: list[Event],
                last: int) -> None:
        """Write numbered events after ``last`` and move the session's pointer (inside the
        caller's transaction)."""
        conn.executemany(
            "INSERT INTO events (session_id, seq, kind, source, action_id, ts, body_json)"
            " VALUES (?,?,?,?,?,?,?)",
            (_event_row(session_id, e) for e in stamped),
        )
        self._move_pointer(conn, session_id, stamped, last)

    def _move_pointer(
        self, conn: sqlite3.Connection, session_id: str, events: list[Event], last: int
    ) -> None:
        state = last_state(events)
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


    # ---- ownership -----------------------------------------------------------------

    def claim_owner(self, session_id: str) -> int:
        """Become the session's one writer: a new, higher owner token (promise I3).

        Appends that pass an older token fail with LeaseLost from then on, so a Controller
        that lives on beside its replacement can never write into the log.
        """
        conn = self._conn()
        try:
            with immediate(conn):
                self._last_seq(conn, session_id)
                row = self._query_one(_OWNER_SQL, (session_id,), conn)
                token = (int(row[0]) if row else 0) + 1
                conn.execute(
                    "INSERT INTO session_meta (session_id, key, value) VALUES (?, 'owner', ?)"
                    " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
                    (session_id, str(token)),
                )
        except sqlite3.Error as e:
            fault = storage_fault(e)  # the disk, not the session: a state to wait out (I6)
            if fault is not None:
                raise fault from e
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
            with immediate(conn):
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


