"""trouper's log lines as JSON (``TROUPER_LOG_FORMAT=json``), and what each record says
about where it was made: the kind of process (its *role*) and the session it is about.

The line itself is the sandbox's ``JsonFormatter`` (``runtimes/sandbox/logs.py``: one
shape for trouper's lines and the sandbox server's); ``JsonFormatter`` here adds the
masking with every secret this process knows (``security/masking.py``; records are
masked where they are made already, this catches what came another way).

Where a record is written is often not where it was made: an actor's records are
pickled to Thespian's logger process, which writes ``logs/trouper.log``. So the role,
the session id and the trace id are set on the record *where it is made*, by a record
factory (``install_log_context``), as attributes that travel with it:

- the role: what this process was told it is (``set_log_role``: an actor's ``role``,
  ``cli``, ``daemon``), else its process name as ``host/processes.name_process`` set it
  without the ``trouper-`` prefix (``admin``, ``zygote``), else ``program``;
- the session id: the one the message being handled names (``about_session``, set by the
  actor base around each message), else the actor's own ``session_id`` (a Controller and
  a RuntimeProxy serve one session each);
- the trace id: ``current_trace_id()``, the current span's (None while nothing is traced).

Text logs (the default) keep their format; the factory is installed only for JSON.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator
from typing import Any

from ..runtimes.sandbox.logs import (
    LOG_FORMAT_ENV,
    ROLE_ATTR,
    SESSION_ATTR,
    TRACE_ATTR,
)
from ..runtimes.sandbox.logs import JsonFormatter as LineFormatter

__all__ = ["LOG_FORMAT_ENV", "JsonFormatter", "about_session", "bind_actor",
           "current_role", "current_session_id", "current_trace_id", "install_log_context",
           "json_logs", "set_log_role"]

JSON_FORMATTER = f"{__name__}.JsonFormatter"
"""The dotted name a ``logging.config`` ``"()"`` entry makes the formatter by."""


def json_logs() -> bool:
    """Whether this process's settings ask for JSON log lines (``TROUPER_LOG_FORMAT``)."""
    from ..config.settings import settings

    return settings().log_format == "json"


def current_trace_id() -> str | None:
    """The trace the code running now belongs to: OpenTelemetry's current span's trace id
    (else the Controller's open turn's), as 32 hex digits; None while this process traces
    nothing (``observability/tracing.py``: off, nothing of OpenTelemetry is imported)."""
    from ..observability import tracing

    return tracing.current_trace_id()


_role: tuple[int, str] | None = None
"""(pid, role) told by ``set_log_role``: a forked child has another pid, so it does not
take its parent's role for its own before it is told."""
_actor: tuple[int, Any] | None = None
"""(pid, the actor this process runs), for its ``session_id``."""
_message_session: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "trouper_log_session", default=None)


def set_log_role(role: str) -> None:
    """Name this process's kind in its records (``cli``, ``daemon``, an actor's role).
    A program's own role (not an actor's) lets go of any actor bound here: a program
    that built an actor in its own process (a test does) does not log as that actor."""
    global _role, _actor
    _role = (os.getpid(), role)
    if _actor is not None and str(getattr(_actor[1], "role", "actor")) != role:
        _actor = None


def bind_actor(actor: Any) -> None:
    """This process runs ``actor``: its ``role`` names the process in its records, and its
    ``session_id`` (when it has one) the session they are about. Installs the record
    factory when the logs are JSON."""
    global _actor
    set_log_role(str(getattr(actor, "role", "actor")))
    _actor = (os.getpid(), actor)
    if json_logs():
        install_log_context()


@contextlib.contextmanager
def about_session(session_id: str | None) -> Iterator[None]:
    """Records made inside (on this thread) are about ``session_id`` (None: as before)."""
    if not session_id:
        yield
        return
    token = _message_session.set(session_id)
    try:
        yield
    finally:
        _message_session.reset(token)


def current_role() -> str:
    """This process's kind: see the module's doc."""
    told = _role
    if told is not None and told[0] == os.getpid():
        return told[1]
    try:
        with open("/proc/self/comm", encoding="utf-8") as comm:
            name = comm.read().strip()
    except OSError:
        name = ""
    return name[len("trouper-"):] if name.startswith("trouper-") else "program"


def current_session_id() -> str | None:
    """The session the record being made is about, or None."""
    named = _message_session.get()
    if named:
        return named
    bound = _actor
    if bound is None or bound[0] != os.getpid():
        return None
    try:
        own = getattr(bound[1], "session_id", None)
    except Exception:  # noqa: BLE001 - a half-built actor: its records name no session
        return None
    return own if isinstance(own, str) and own else None


_installed: dict[str, Any] = {"previous": None}


def install_log_context() -> None:
    """Set the role, session id and trace id on every record where it is made (in this
    process and in every process forked from it later). Idempotent."""
    if _installed["previous"] is not None:
        return
    _installed["previous"] = logging.getLogRecordFactory()
    logging.setLogRecordFactory(_record_with_context)


def _record_with_context(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record: logging.LogRecord = _installed["previous"](*args, **kwargs)
    setattr(record, ROLE_ATTR, current_role())
    setattr(record, SESSION_ATTR, current_session_id())
    setattr(record, TRACE_ATTR, current_trace_id())
    return record


class JsonFormatter(LineFormatter):
    """trouper's JSON lines: the sandbox's, masked with every secret this process knows;
    a record made in this process without the factory gets this process's role."""

    def __init__(self, role: str | None = None) -> None:
        super().__init__(masker=None, role=role)

    def format(self, record: logging.LogRecord) -> str:  # noqa: A003 - logging's name
        from ..security.masking import mask_known

        if self.role is None and record.process == os.getpid() and not hasattr(
                record, ROLE_ATTR):
            setattr(record, ROLE_ATTR, current_role())
        return mask_known(super().format(record))
