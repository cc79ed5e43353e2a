"""Calls from one daemon to another, through the store: what reaches the daemon that runs
a session, from whichever daemon a client asked.

A call is a row of ``daemon_calls``: the daemon it is for, the session it is about, and
its body sealed with the cluster key (it may hold a session's secrets: a create's API
key). Its insert NOTIFYs ``call:<daemon>`` on the store's channel; that daemon's
``CallTaker`` takes it (``taken_at``), carries it out and writes the sealed answer, which
NOTIFYs ``answer:<id>``; the caller, waiting on that notice (and reading once a second
should a notice be lost), reads it and deletes the row. Nothing else is kept.

A call always carries a request id: when its daemon dies before answering, the daemon
that adopts the session gets the call again (``registry._retarget_calls``), and a command
carried out before is answered, not carried out twice (``Trouper.command``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from ..exceptions import (
    ConfigError,
    Conflict,
    InvalidRequest,
    RequestTimeout,
    StoreError,
    TrouperError,
    UnknownSession,
)
from ..store.postgres import PostgresEventStore
from .key import ClusterKey

logger = logging.getLogger(__name__)

_CALL, _ANSWER = "daemon call", "daemon answer"
_POLL_S = 1.0
"""Caller and taker read at least this often, should a notice be lost."""
ERRORS: dict[str, type[TrouperError]] = {
    cls.__name__: cls for cls in (ConfigError, Conflict, InvalidRequest, RequestTimeout, StoreError,
                                  UnknownSession, TrouperError)}
"""The errors a call's answer may carry back, raised again at the caller as these."""

Handler = Callable[[dict[str, Any]], Any]
"""Carries out a call's body; its return value (JSON) is the answer."""


class Calls:
    """Making calls and waiting for their answers."""

    def __init__(self, store: PostgresEventStore, key: ClusterKey) -> None:
        self.store, self.key = store, key

    def call(self, daemon: str, session_id: str | None, body: dict[str, Any],
             timeout_s: float, still_for: Callable[[], str | None] | None = None) -> Any:
        """Ask ``daemon`` to carry out ``body``; its answer, or the error it raised.

        Raises RequestTimeout when no answer comes within ``timeout_s`` (the call is then
        withdrawn if nobody took it). ``still_for``: who the call is for now (the daemon
        the session moved to), asked while waiting, for the message only."""
        subject = session_id or "-"
        call_id = self.post(daemon, session_id, body)
        try:
            answer = self._wait(call_id, subject, timeout_s)
        finally:
            with self.store.pooled("end a daemon call in") as conn:
                conn.execute("DELETE FROM daemon_calls WHERE id = %s", (call_id,))
        if answer is None:
            now = still_for() if still_for is not None else daemon
            raise RequestTimeout(f"daemon {now or daemon!r} did not answer within "
                                 f"{timeout_s:g} s")
        if "error" in answer:
            kind = ERRORS.get(answer["error"].get("type"), TrouperError)
            raise kind(answer["error"].get("message", "the daemon failed"))
        return answer.get("ok")

    def post(self, daemon: str, session_id: str | None, body: dict[str, Any],
             conn: psycopg.Connection | None = None) -> int:
        """Make a call and return its id without waiting. A body with ``"reply": False``
        is answered by no one: its row goes once it is carried out. ``conn``: a
        transaction of the caller's to make it in (it stands or falls with it)."""
        if conn is None:
            with self.store.pooled("make a daemon call in") as own, own.transaction():
                return self.post(daemon, session_id, body, own)
        sealed = self.key.seal(_CALL, session_id or "-", body)
        row = conn.execute(
            "INSERT INTO daemon_calls (daemon, session_id, sealed) VALUES (%s, %s, %s)"
            " RETURNING id", (daemon, session_id, sealed)).fetchone()
        assert row is not None
        conn.execute("SELECT pg_notify(%s, %s)", (self.store.channel, f"call:{daemon}"))
        return int(row[0])

    def _wait(self, call_id: int, subject: str, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        with self.store.listener().watching(f"answer:{call_id}") as woken:
            while True:
                woken.clear()
                with self.store.pooled("read a daemon answer in") as conn:
                    row = conn.execute("SELECT answer FROM daemon_calls WHERE id = %s AND"
                                       " answered_at IS NOT NULL", (call_id,)).fetchone()
                if row is not None:
                    return self.key.open(_ANSWER, subject, row[0])  # type: ignore[no-any-return]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                woken.wait(min(_POLL_S, left))


class CallTaker:
    """A daemon's side: a thread that takes the calls for it and carries each out on a
    small pool (a call may wait on its session's actors)."""

    def __init__(self, store: PostgresEventStore, key: ClusterKey, name: str,
                 handler: Handler, workers: int = 8) -> None:
        self.store, self.key, self.name, self.handler = store, key, name, handler
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="daemon-call")
        self._thread = threading.Thread(target=self._run, name="daemon-calls", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Take no more calls; those being carried out finish first."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True)

    def _run(self) -> None:
        with self.store.listener().watching(f"call:{self.name}") as woken:
            while not self._stop.is_set():
                woken.clear()
                try:
                    for call_id, session_id, sealed in self._take():
                        self._pool.submit(self._carry_out, call_id, session_id, sealed)
                except StoreError as exc:
                    logger.warning("daemon calls: %s", exc)
                woken.wait(_POLL_S)

    def _take(self) -> list[tuple[int, str | None, bytes]]:
        with self.store.pooled("take daemon calls in") as conn, conn.transaction():
            rows = conn.execute(
                "UPDATE daemon_calls SET taken_at = now() WHERE id IN (SELECT id FROM"
                " daemon_calls WHERE daemon = %s AND taken_at IS NULL ORDER BY id"
                " FOR UPDATE SKIP LOCKED) RETURNING id, session_id, sealed", (self.name,)
            ).fetchall()
        return [(int(r[0]), r[1], bytes(r[2])) for r in rows]

    def _carry_out(self, call_id: int, session_id: str | None, sealed: bytes) -> None:
        subject = session_id or "-"
        body: dict[str, Any] = {}
        try:
            body = self.key.open(_CALL, subject, sealed)
            answer: dict[str, Any] = {"ok": self.handler(body)}
        except TrouperError as exc:
            answer = {"error": {"type": _known_type(exc), "message": str(exc)}}
        except Exception as exc:  # noqa: BLE001 - the caller is told, as a 500 would
            logger.exception("daemon call %d failed", call_id)
            answer = {"error": {"type": "TrouperError",
                                "message": f"{type(exc).__name__}: {exc}"}}
        try:
            if body.get("reply") is False:
                with self.store.pooled("end a daemon call in") as conn:
                    conn.execute("DELETE FROM daemon_calls WHERE id = %s", (call_id,))
                return
            with self.store.pooled("answer a daemon call in") as conn, conn.transaction():
                conn.execute("UPDATE daemon_calls SET answered_at = now(), answer = %s"
                             " WHERE id = %s AND daemon = %s",
                             (self.key.seal(_ANSWER, subject, answer), call_id, self.name))
                conn.execute("SELECT pg_notify(%s, %s)",
                             (self.store.channel, f"answer:{call_id}"))
        except StoreError as exc:  # the caller times out and its client retries
            logger.warning("daemon call %d: its answer was not written: %s", call_id, exc)


def _known_type(exc: TrouperError) -> str:
    for cls in type(exc).__mro__:
        if cls.__name__ in ERRORS:
            return cls.__name__
    return "TrouperError"
