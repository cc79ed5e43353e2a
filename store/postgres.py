"""The event store on PostgreSQL, for sessions shared by several hosts.

Named by a URL (``postgresql://user:password@host:5432/trouper``; ``open_store`` picks it).
The same contract as the SQLite store (``store/base.py``), the same JSON for configs and
events (``store/serial.py``), and the same secrets kept out (the API key is never
written; every known secret value is masked).

Appends (I3 in docs/promises.md): one transaction locks the session's row
(``SELECT ... FOR UPDATE``), checks the owner token when one is given, inserts the batch
numbered after ``last_seq`` and moves the pointer, then commits. Every writer of a session
(``append``, ``claim_owner``, ``put_meta``) takes that row lock first, so under READ
COMMITTED the owner check reads the latest committed claim: an append by a writer whose
lease was claimed away fails with LeaseLost in the very transaction that would have
written, and writes nothing. The primary key (session, seq) backs the numbering.

Followers (``follow``) share one connection per store object and process that LISTENs on
the store's channel, which every append NOTIFYs in its own transaction (so a notice never
precedes its events): ``store/postgres_listen.py``. A follower reads through the pool
when an append to its session is announced or the listener reconnected, and once a
second should a notice be missed; between notices it waits on an Event.

Connections, pooling, fork safety and errors: ``store/postgres_conn.py``; the schema and
its migrations: ``store/postgres_schema.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from ..config.models import SessionConfig
from ..exceptions import InvalidRequest, LeaseLost, StoreError
from ..messages.events import AgentState, Event, event_from_json
from ..observability.timing import timed_append
from .base import REPLACED_BY, SessionRecord
from .postgres_conn import PostgresConnections, unknown
from .serial import last_state, public_config_json, stamp, stored_config

logger = logging.getLogger(__name__)

_COLUMNS = "id, config_json, created_at, updated_at, last_seq, state, state_reason"
_REPLACED_BY = (f"(SELECT value FROM session_meta m WHERE m.session_id = sessions.id"
                f" AND m.key = '{REPLACED_BY}')")
_RECORD_COLUMNS = f"{_COLUMNS}, {_REPLACED_BY}"
"""What ``_record`` reads: the row, and the session that replaced it (or NULL)."""
_NOT_REPLACED = f"NOT EXISTS {_REPLACED_BY}"
_FOLLOW_PAGE = 1000
_FALLBACK_POLL_S = 1.0
"""A follower reads at least this often, even when no notice came."""
_WAIT_SLICE_S = 0.1
"""How often a waiting follower looks at ``stop``, its deadline and ``close()``."""
_OWNER_SQL = "SELECT value FROM session_meta WHERE session_id = %s AND key = 'owner'"
_LOCK_SQL = "SELECT last_seq FROM sessions WHERE id = %s FOR UPDATE"


def _record(row: Sequence[Any]) -> SessionRecord:
    """A session from ``_RECORD_COLUMNS`` (a row just inserted: ``_COLUMNS``, no
    replacement yet)."""
    session_id, config_json, created_at, updated_at, last_seq, state, reason = row[:7]
    return SessionRecord(
        session_id=session_id, config=stored_config(session_id, config_json),
        created_at=created_at.astimezone(UTC), updated_at=updated_at.astimezone(UTC),
        last_seq=last_seq, state=AgentState(state), state_reason=reason,
        replaced_by=row[7] if len(row) > 7 else None)


class PostgresEventStore(PostgresConnections):
    """The ``EventStore`` on a PostgreSQL database.

    Example::

        store = PostgresEventStore("postgresql://trouper:pw@127.0.0.1:5432/trouper")
        store.create_session("s1", config)
        [ev] = store.append("s1", [MessageEvent(source="user", text="hi")])
        assert ev.seq == 1 and store.read("s1") == [ev]
        store.close()
    """

    # ---- sessions ----------------------------------------------------------------

    def create_session(self, session_id: str, config: SessionConfig,
                       events: Sequence[Event] = ()) -> SessionRecord:
        """Create a session in state LOADING, with ``events`` as its log in the same
        transaction (see EventStore); an existing id raises InvalidRequest."""
        if not session_id:
            raise InvalidRequest("a session id must not be empty")
        try:
            with self.pooled(f"create session {session_id!r} in") as conn, conn.transaction():
                row = conn.execute(
                    f"INSERT INTO sessions ({_COLUMNS}) VALUES (%s, %s, now(), now(), 0, %s, '')"
                    f" RETURNING {_COLUMNS}",
                    (session_id, public_config_json(config), AgentState.LOADING.value),
                ).fetchone()
                if events:
                    self._insert(conn, session_id, stamp(events, 0), 0)
        except StoreError as e:
            if isinstance(e.__cause__, psycopg.errors.UniqueViolation):
                raise InvalidRequest(f"session {session_id!r} already exists") from e
            raise
        logger.info("session %s: created", session_id)
        assert row is not None
        return self.session(session_id) if events else _record(row)

    def session(self, session_id: str) -> SessionRecord:
        """The session's record; an unknown id raises UnknownSession."""
        rows = self._query(f"SELECT {_RECORD_COLUMNS} FROM sessions WHERE id = %s",
                           (session_id,))
        if not rows:
            raise unknown(session_id)
        return _record(rows[0])

    def sessions(self, *, replaced: bool = True) -> list[SessionRecord]:
        """Every session, newest first; the replaced ones left out without ``replaced``."""
        where = "" if replaced else f" WHERE {_NOT_REPLACED}"
        rows = self._query(f"SELECT {_RECORD_COLUMNS} FROM sessions{where}"
                           " ORDER BY created_at DESC, ord DESC", ())
        return [_record(row) for row in rows]

    def sessions_page(
        self, *, states: Collection[AgentState] | None = None, cursor: str | None = None,
        limit: int = 100, replaced: bool = True,
    ) -> tuple[list[SessionRecord], str | None]:
        """A page of sessions, newest first (see EventStore.sessions_page)."""
        if states is not None and not states:
            return [], None
        where, args = ["TRUE" if replaced else _NOT_REPLACED], []
        if states is not None:
            where.append("state = ANY(%s)")
            args.append([AgentState(s).value for s in states])
        if cursor:
            created_text, _, ord_text = cursor.rpartition("|")
            try:
                created = datetime.fromisoformat(created_text)
            except ValueError:
                created = None
            if (created is None or created.tzinfo is None
                    or not (ord_text.isascii() and ord_text.isdigit()) or len(ord_text) > 18):
                raise InvalidRequest(f"not a cursor of this store: {cursor!r}")
            where.append("(created_at, ord) < (%s, %s)")
            args += [created, int(ord_text)]
        size = max(1, limit)
        rows = self._query(
            f"SELECT {_RECORD_COLUMNS}, ord FROM sessions WHERE {' AND '.join(where)}"
            " ORDER BY created_at DESC, ord DESC LIMIT %s", (*args, size + 1))
        more = len(rows) > size
        rows = rows[:size]
        after = f"{rows[-1][2].astimezone(UTC).isoformat()}|{rows[-1][-1]}" if more else None
        return [_record(row) for row in rows], after

    def last_seq(self, session_id: str) -> int:
        """The ``seq`` of the session's latest event; 0 when its log is empty."""
        rows = self._query("SELECT last_seq FROM sessions WHERE id = %s", (session_id,))
        if not rows:
            raise unknown(session_id)
        return int(rows[0][0])

    # ---- events ------------------------------------------------------------------

    @timed_append("postgres")  # trouper_store_append_seconds (docs/operations.md)
    def append(
        self, session_id: str, events: Sequence[Event], *, owner: int | None = None
    ) -> list[Event]:
        """Append ``events`` after the session's last one, all or none (see EventStore)."""
        with self.pooled(f"append to session {session_id!r} in") as conn, conn.transaction():
            last = self._lock_session(conn, session_id)
            if owner is not None:
                self._check_owner(conn, session_id, owner)
            stamped = stamp(events, last)
            self._insert(conn, session_id, stamped, last)
        return stamped

    def _insert(self, conn: Any, session_id: str, stamped: list[Event], last: int) -> None:
        """Write numbered events after ``last``, move the session's pointer and notify its
        followers (inside the caller's transaction)."""
        try:
            rows = [_event_row(session_id, e) for e in stamped]
        except ValueError as e:  # an event that cannot be serialised (pydantic's error)
            raise StoreError(f"cannot append to session {session_id!r}: {e}") from e
        if rows:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO events (session_id, seq, kind, source, action_id, ts,"
                    " body_json) VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)
        conn.execute(
            "UPDATE sessions SET last_seq = %s,"
            " updated_at = greatest(updated_at, clock_timestamp()),"
            " state = coalesce(%s, state), state_reason = coalesce(%s, state_reason)"
            " WHERE id = %s", (last + len(stamped), *last_state(stamped), session_id))
        if rows:
            conn.execute("SELECT pg_notify(%s, %s)", (self.channel, session_id))

    def read(self, session_id: str, since: int = 0, limit: int | None = None) -> list[Event]:
        """Events with ``seq > since`` in order, at most ``limit`` of them (None: all)."""
        if limit is not None and limit < 0:
            limit = None  # as SQLite reads a negative LIMIT: no limit
        rows = self._query("SELECT body_json FROM events WHERE session_id = %s AND seq > %s"
                           " ORDER BY seq LIMIT %s", (session_id, since, limit))
        if not rows:
            self.last_seq(session_id)  # raises UnknownSession for an unknown id
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
        through the pool when the store's one listening connection hears of an append to
        this session (``store/postgres_listen.py``), and at least once a second
        (``poll_s`` is the SQLite store's and is not used). It ends when ``stop`` is set
        (checked before every event and while waiting), when the store is closed, or at
        the deadline ``timeout_s`` after this call, checked before every read but the
        first.
        """
        self.last_seq(session_id)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self._follow(session_id, since, deadline, stop or threading.Event())

    def _follow(
        self, session_id: str, since: int, deadline: float | None, stop: threading.Event
    ) -> Iterator[Event]:
        try:
            with self.listener().watching(session_id) as woken:
                while not (stop.is_set() or self.closed):
                    woken.clear()  # before the read: a notice from now on is not lost
                    with self.pooled(f"follow session {session_id!r} in") as conn:
                        rows = conn.execute(
                            "SELECT body_json FROM events WHERE session_id = %s AND seq > %s"
                            " ORDER BY seq LIMIT %s", (session_id, since, _FOLLOW_PAGE),
                        ).fetchall()
                    for (body,) in rows:
                        if stop.is_set():
                            return
                        event = event_from_json(body)
                        yield event
                        since = event.seq
                    if deadline is not None and time.monotonic() >= deadline:
                        return
                    if len(rows) < _FOLLOW_PAGE:
                        self._wait_for_notice(woken, deadline, stop)
        except StoreError:
            if not self.closed:  # closing the store under a follower ends it quietly
                raise

    def _wait_for_notice(self, woken: threading.Event, deadline: float | None,
                         stop: threading.Event) -> None:
        """Until ``woken`` (an append to the session was announced, or the listener
        reconnected), the fallback poll is due, or ``stop``, the deadline or ``close()``."""
        until = time.monotonic() + _FALLBACK_POLL_S
        if deadline is not None:
            until = min(until, deadline)
        while not (stop.is_set() or self.closed):
            left = until - time.monotonic()
            if left <= 0 or woken.wait(min(_WAIT_SLICE_S, left)):
                return

    # ---- ownership -----------------------------------------------------------------

    def claim_owner(self, session_id: str) -> int:
        """Become the session's one writer: a new, higher owner token (promise I3).

        Appends that pass an older token fail with LeaseLost from then on, so a Controller
        that lives on beside its replacement can never write into the log.
        """
        with self.pooled(f"claim session {session_id!r} in") as conn, conn.transaction():
            self._lock_session(conn, session_id)
            row = conn.execute(_OWNER_SQL, (session_id,)).fetchone()
            token = (int(row[0]) if row else 0) + 1
            conn.execute(
                "INSERT INTO session_meta (session_id, key, value) VALUES (%s, 'owner', %s)"
                " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
                (session_id, str(token)))
        return token

    def _check_owner(self, conn: psycopg.Connection, session_id: str, owner: int) -> None:
        row = conn.execute(_OWNER_SQL, (session_id,)).fetchone()
        current = int(row[0]) if row else 0
        if current != owner:
            raise LeaseLost(
                f"session {session_id!r} is now written by owner {current}, not {owner}")

    # ---- meta --------------------------------------------------------------------

    def put_meta(self, session_id: str, key: str, value: str) -> None:
        """Set a small per-session value (owner leases and such)."""
        with self.pooled(f"set {key!r} of session {session_id!r} in") as conn, \
                conn.transaction():
            self._lock_session(conn, session_id)  # 'owner' is fenced as claim_owner is
            conn.execute(
                "INSERT INTO session_meta (session_id, key, value) VALUES (%s, %s, %s)"
                " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
                (session_id, key, value))

    def get_meta(self, session_id: str, key: str) -> str | None:
        """A per-session value, or ``None`` when ``key`` was never set."""
        rows = self._query("SELECT value FROM session_meta WHERE session_id = %s AND key = %s",
                           (session_id, key))
        if not rows:
            self.last_seq(session_id)  # raises UnknownSession for an unknown id
            return None
        return str(rows[0][0])

    # ---- helpers -----------------------------------------------------------------

    def _lock_session(self, conn: psycopg.Connection, session_id: str) -> int:
        """Lock the session's row for this transaction; its ``last_seq``."""
        row = conn.execute(_LOCK_SQL, (session_id,)).fetchone()
        if row is None:
            raise unknown(session_id)
        return int(row[0])

    def _query(self, query: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self.pooled("read") as conn:
            return conn.execute(query, args).fetchall()


def _event_row(session_id: str, e: Event) -> tuple[Any, ...]:
    action_id = getattr(e, "action_id", None)
    return (session_id, e.seq, e.kind, e.source, action_id, e.ts, e.model_dump_json())
