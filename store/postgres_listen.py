"""One LISTENing connection per PostgreSQL store object and process, shared by its followers.

A daemon streams each session to many clients, each a ``follow()``; a connection of its own
per follower would spend the server's ``max_connections`` (100 by default) on a hundred
idle clients, and a cluster of daemons shares one server. So a store has one ``Listener``:
a thread that holds one connection, LISTENs on the store's channel (every append NOTIFYs
it with the session's id, in the append's own transaction) and wakes the followers of that
session. Followers read their events through the pool, a short-lived connection per read:
N followers cost one listening connection plus pool use.

The thread starts with the first follower and stops when the last one ends, or at
``close()``. When its connection is lost (the server restarted, the backend was
terminated) it wakes every follower, so each re-reads at once (and learns of an outage
from its read), then reconnects with a growing pause; once it LISTENs again it wakes
every follower once more, since a notice sent while it was away is lost. A follower also
reads at least once per fallback period (``store/postgres.py``), so a notice lost any
other way never leaves it stuck.

After a fork the child never touches its parent's listener (the thread does not exist
there, its connection's socket points at /dev/null: ``store/postgres_conn.py``); the
child's first follower starts a listener of its own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

import psycopg
from psycopg import sql

from ..exceptions import StoreError

logger = logging.getLogger(__name__)

_SLICE_S = 0.1
"""How often the listening thread looks whether it should stop."""
_RETRY_S = (0.1, 0.2, 0.5, 1.0, 2.0)
"""Pauses between tries to reconnect the listening connection (the last one repeats)."""
_JOIN_S = 5.0
"""How long ``close()`` waits for the listening thread to end."""


class _Run:
    """One incarnation of the listening thread: its stop flag and its thread."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.failures = 0
        """Failed tries since the connection last LISTENed (the pause grows with them)."""


class Listener:
    """The LISTENing side of one store object in one process.

    ``connect`` opens a new (autocommit) connection, the listening one; ``channel`` is the
    NOTIFY channel; ``where`` names the store in log lines.

    Example::

        listener = Listener(store.connect_listener, "trouper_events", store.where)
        with listener.watching("s1") as woken:
            woken.clear()
            ...  # read the session's new events
            woken.wait(1.0)  # set by an append to s1, or by a reconnect, or by close()
        listener.close()
    """

    def __init__(self, connect: Callable[[], psycopg.Connection], channel: str,
                 where: str) -> None:
        self._connect = connect
        self._channel = channel
        self._where = where
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._run: _Run | None = None
        self._runs: list[_Run] = []
        """Every thread started and not yet known to have ended (``close`` joins them)."""
        self._closed = False

    @contextlib.contextmanager
    def watching(self, session_id: str) -> Iterator[threading.Event]:
        """An Event set whenever an append to ``session_id`` is announced, whenever the
        listener (re)connects or loses its connection, and at ``close()``; the caller
        clears it before it reads. Starts the listening thread if none runs; the last
        watcher to leave stops it."""
        woken = threading.Event()
        with self._lock:
            if self._closed:
                woken.set()
            else:
                self._waiters.setdefault(session_id, set()).add(woken)
                if self._run is None:
                    self._start()
        try:
            yield woken
        finally:
            with self._lock:
                waiters = self._waiters.get(session_id)
                if waiters is not None:
                    waiters.discard(woken)
                    if not waiters:
                        del self._waiters[session_id]
                if not self._waiters and self._run is not None:
                    self._run.stop.set()  # it closes its connection within a slice
                    self._run = None

    @property
    def watchers(self) -> int:
        """How many followers are watching now."""
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

    @property
    def running(self) -> bool:
        """Whether a listening thread of this listener still runs."""
        with self._lock:
            return bool(self._runs)

    def close(self) -> None:
        """Stop the listening thread and wake every watcher (they see their store closed).
        Idempotent."""
        with self._lock:
            self._closed = True
            if self._run is not None:
                self._run.stop.set()
                self._run = None
            runs = list(self._runs)
            self._wake_all_locked()
        for run in runs:
            if run.thread is not None and run.thread is not threading.current_thread():
                run.thread.join(_JOIN_S)

    # ---- the listening thread ----------------------------------------------------

    def _start(self) -> None:
        run = _Run()
        run.thread = threading.Thread(target=self._listen, args=(run,), daemon=True,
                                      name=f"trouper-listen-{self._channel}")
        self._run = run
        self._runs.append(run)
        run.thread.start()

    def _listen(self, run: _Run) -> None:
        try:
            while not run.stop.is_set():
                try:
                    self._serve(run)
                    return
                except (psycopg.Error, StoreError) as e:
                    if run.stop.is_set():
                        return
                    logger.log(logging.DEBUG if run.failures else logging.WARNING,  # once
                               "event store %s: the listening connection failed (%s);"
                               " reconnecting", self._where, e)
                except Exception:  # never leave the followers without a listener
                    logger.exception("event store %s: the listening thread failed",
                                     self._where)
                self._wake_all()  # each follower re-reads now: an outage is seen at once
                run.stop.wait(_RETRY_S[min(run.failures, len(_RETRY_S) - 1)])
                run.failures += 1
        finally:
            with self._lock:
                self._runs.remove(run)

    def _serve(self, run: _Run) -> None:
        """LISTEN on one connection and dispatch its notices until ``run.stop``."""
        conn = self._connect()
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self._wake_all()  # a notice sent before LISTEN took effect was never heard
            run.failures = 0
            while not run.stop.is_set():
                for notice in conn.notifies(timeout=_SLICE_S):
                    self._wake(notice.payload)
        finally:
            conn.close()

    def _wake(self, session_id: str) -> None:
        with self._lock:
            for woken in self._waiters.get(session_id, ()):
                woken.set()

    def _wake_all(self) -> None:
        with self._lock:
            self._wake_all_locked()

    def _wake_all_locked(self) -> None:
        for waiters in self._waiters.values():
            for woken in waiters:
                woken.set()
