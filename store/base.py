"""The event store contract: the durable log that is the truth of every session (I3 in
docs/promises.md).

A session is a row (``SessionRecord``: its config, state and the pointer to its latest
event) plus an append-only log of events numbered 1, 2, 3... with no gap. ``append``
writes a batch of events and moves the pointer in ONE transaction, so a crash at any
instant leaves either the whole batch or none of it.

Nothing outside ``store/`` may assume the store is a local file: SQLite (``sqlite.py``,
the embedded default) and PostgreSQL (``postgres.py``, shared by hosts) both implement
this protocol, and ``tests/test_store_contract.py`` holds both to it.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from ..config.models import SessionConfig
from ..messages.base import Frozen
from ..messages.events import AgentState, Event

REPLACED_BY = "replaced_by"
"""Session meta key: the id of the session that took this one's place in the user's list
(a rewind, docs/time-travel.md). ``sessions(replaced=False)`` and
``sessions_page(replaced=False)`` leave a replaced session out: the user's lists."""
REPLACES = "replaces"
"""Session meta key: the id of the session this one replaced (the other side of
``REPLACED_BY``)."""


class SessionRecord(Frozen):
    """One session as the store knows it (secrets are never stored)."""

    session_id: str
    config: SessionConfig
    """The session's config as stored: ``llm.api_key`` is always ``None`` here."""
    created_at: datetime
    """UTC."""
    updated_at: datetime
    """UTC; moved by every append."""
    last_seq: int
    """The ``seq`` of the latest event; 0 when the log is empty."""
    state: AgentState
    """The state of the latest ``StateChanged`` in the log; LOADING before any."""
    state_reason: str
    """The reason of that ``StateChanged``; empty before any."""
    replaced_by: str | None = None
    """The session that took this one's place in the list (its ``REPLACED_BY`` meta), or
    None."""


@runtime_checkable
class EventStore(Protocol):
    """A durable, append-only event log per session. Safe across threads and processes.

    Errors: an unknown session id raises ``UnknownSession`` (naming the id); a request
    that cannot apply raises ``InvalidRequest``; a failure of the backend itself raises
    ``StoreError`` with the cause chained.
    """

    def create_session(self, session_id: str, config: SessionConfig,
                       events: Sequence[Event] = ()) -> SessionRecord:
        """Create a session in state LOADING; an existing id raises InvalidRequest. With
        ``events``, they are its log from the start, in the same transaction: a crash
        can never leave the session without them (a fork's copied log)."""
        ...

    def session(self, session_id: str) -> SessionRecord:
        """The session's record."""
        ...

    def sessions(self, *, replaced: bool = True) -> list[SessionRecord]:
        """Every session, newest first; without ``replaced``, those replaced by another
        (``REPLACED_BY``) left out. Every one by default: what resumes sessions or
        cleans up after them must see them all; a user's list asks for fewer."""
        ...

    def sessions_page(
        self, *, states: Collection[AgentState] | None = None, cursor: str | None = None,
        limit: int = 100, replaced: bool = True,
    ) -> tuple[list[SessionRecord], str | None]:
        """At most ``limit`` sessions, newest first (the order of ``sessions()``), only
        those whose state is in ``states`` (None: all), after ``cursor`` (a value a
        previous page returned; None: from the newest). Returns the page and the cursor
        of the next page, None when this one is the last. Sessions created meanwhile do
        not shift a page (they come before the first). A cursor this store did not make
        raises InvalidRequest. Without ``replaced``, a replaced session is on no page (one
        replaced meanwhile leaves the pages still to come)."""
        ...

    def append(
        self, session_id: str, events: Sequence[Event], *, owner: int | None = None
    ) -> list[Event]:
        """Append ``events`` after the session's last one, all or none, in one transaction.

        The events come in with ``seq=0``; the returned copies carry their ``seq``
        (contiguous after the session's last). The same transaction moves the session's
        ``last_seq`` and ``updated_at``, and its ``state``/``state_reason`` when a
        ``StateChanged`` is among the events (the last one wins). With ``owner``, the
        append fails with LeaseLost unless that token is still the session's owner.
        """
        ...

    def claim_owner(self, session_id: str) -> int:
        """Make the caller the session's one writer; returns its owner token."""
        ...

    def read(self, session_id: str, since: int = 0, limit: int | None = None) -> list[Event]:
        """Events with ``seq > since`` in order, at most ``limit`` of them (None: all)."""
        ...

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

        Ends when ``stop`` is set or at the deadline ``timeout_s`` after the call
        (``None``: no deadline; then only ``stop`` or closing the store ends it).
        """
        ...

    def last_seq(self, session_id: str) -> int:
        """The ``seq`` of the session's latest event; 0 when its log is empty."""
        ...

    def put_meta(self, session_id: str, key: str, value: str) -> None:
        """Set a small per-session value (owner leases and such)."""
        ...

    def get_meta(self, session_id: str, key: str) -> str | None:
        """A per-session value, or ``None`` when ``key`` was never set."""
        ...

    def close(self) -> None:
        """Release the store's connections. Idempotent."""
        ...
