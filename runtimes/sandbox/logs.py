"""The server's log: secrets masked in every line, and noisy events logged once a while.

``MaskingFormatter`` masks the whole formatted record, traceback included, so no code
path can put a secret value into server.log. ``JsonFormatter`` writes a record as one
JSON object a line, masked the same way: trouper's own JSON log lines are made by it too
(``home/log_format.py``; this package imports nothing outside itself, trouper may import
from it), so the server's lines and trouper's have one shape. ``OncePer`` lets a caller
log an event at most once per period for each key (a client address, say): a storm of
bad requests gives one line a period, with a count, never one line a request.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from .mask import TextMasker

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

LOG_FORMAT_ENV = "TROUPER_LOG_FORMAT"
"""``json``: every log line a JSON object (``JsonFormatter``); else, or unset, text. The
server's starter passes it in the environment (``runtimes/local.py``)."""
LOG_SESSION_ENV = "TROUPER_LOG_SESSION_ID"
"""With JSON lines: the session the server serves, which its lines name."""
ROLE_ATTR = "trouper_role"
"""A record's attribute naming the kind of process that made it (set where the record is
made: a record forwarded to another process to be written keeps it)."""
SESSION_ATTR = "trouper_session_id"
"""A record's attribute naming the session it is about, when one is known."""
TRACE_ATTR = "trouper_trace_id"
"""A record's attribute holding the trace it belongs to (None until tracing exists)."""
SEQ_ATTR = "seq"
"""The event seq a record is about, given as ``extra={"seq": n}`` by the logging call."""


class JsonFormatter(logging.Formatter):
    """One record as one JSON line: ``ts`` (ISO 8601 UTC), ``level``, ``logger``,
    ``message``, ``pid``, ``role``, ``session_id``, ``seq``, ``trace_id`` and ``exc`` (the
    traceback, when there is one), every field always present (null when unknown).

    The whole line is masked with ``masker`` after it is encoded, so a secret is caught
    in its JSON-escaped spelling too (the masker knows every escaped spelling, and a
    placeholder keeps the line valid JSON). ``role`` and ``session_id``: this process's
    kind, and the one session it serves, for records that carry none of their own.
    """

    def __init__(self, masker: TextMasker | None = None, role: str | None = None,
                 session_id: str | None = None) -> None:
        super().__init__()
        self.masker = masker
        self.role = role
        self.session_id = session_id

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """The record's fields, before masking."""
        seq = getattr(record, SEQ_ATTR, None)
        return {
            "ts": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            "role": getattr(record, ROLE_ATTR, None) or self.role,
            "session_id": getattr(record, SESSION_ATTR, None) or self.session_id,
            "seq": seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
            "trace_id": getattr(record, TRACE_ATTR, None),
            "exc": self._exc(record),
        }

    def _exc(self, record: logging.LogRecord) -> str | None:
        text = record.exc_text
        if not text and record.exc_info:
            text = self.formatException(record.exc_info)
        if record.stack_info:
            text = (text + "\n" if text else "") + self.formatStack(record.stack_info)
        return text or None

    def format(self, record: logging.LogRecord) -> str:  # noqa: A003 - logging's name
        line = json.dumps(self.fields(record), default=str)
        return self.masker.mask(line) if self.masker is not None else line


def iso_utc(created: float) -> str:
    """``created`` (a record's epoch seconds) as ``2026-01-02T03:04:05.678Z``."""
    when = datetime.datetime.fromtimestamp(created, tz=datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def json_wanted(value: str | None) -> bool:
    """Whether a ``TROUPER_LOG_FORMAT`` value asks for JSON lines."""
    return (value or "").strip().lower() == "json"


class MaskingFormatter(logging.Formatter):
    """A formatter whose output has every secret value replaced by its placeholder."""

    def __init__(self, masker: TextMasker, fmt: str = FORMAT) -> None:
        super().__init__(fmt)
        self.masker = masker

    def format(self, record: logging.LogRecord) -> str:  # noqa: A003 - logging's name
        return self.masker.mask(super().format(record))


def configure(masker: TextMasker, level: int = logging.INFO) -> None:
    """Log to stderr through ``MaskingFormatter`` (``JsonFormatter`` when the environment
    says ``TROUPER_LOG_FORMAT=json``); uncaught exceptions go there too.

    The variables are taken off the environment as they are read: the shell the server
    starts inherits the server's environment, and a setting of trouper's is not the agent's.
    """
    as_json = json_wanted(os.environ.pop(LOG_FORMAT_ENV, None))
    session_id = os.environ.pop(LOG_SESSION_ENV, None) or None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(masker, role="sandbox", session_id=session_id)
                         if as_json else MaskingFormatter(masker))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logger = logging.getLogger("sandbox")

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "?"
        exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
        logger.error("thread %s crashed", name, exc_info=exc_info)  # type: ignore[arg-type]

    threading.excepthook = thread_hook
    sys.excepthook = lambda *exc_info: logger.error("crashed", exc_info=exc_info)


class OncePer:
    """Says when to log an event: the first time for a key, then once per ``period_s``.

    ``due(key)`` returns None when the event should not be logged now, else how many
    events of that key were skipped since the last line (0 the first time).
    """

    def __init__(
        self, period_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self.period_s = period_s
        self._clock = clock
        self._max_keys = max_keys
        self._seen: dict[str, tuple[float, int]] = {}
        """key -> (when it was last logged, events skipped since)."""
        self._lock = threading.Lock()

    def due(self, key: str) -> int | None:
        """None to stay quiet; else the number of events skipped since the last line."""
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.period_s:
                self._seen[key] = (last[0], last[1] + 1)
                return None
            if len(self._seen) >= self._max_keys:
                self._seen.clear()  # bounded memory whatever the number of addresses
            self._seen[key] = (now, 0)
            return last[1] if last is not None else 0
