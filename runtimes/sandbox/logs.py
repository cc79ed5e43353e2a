"""The server's log: secrets masked in every line, and noisy events logged once a while.

``MaskingFormatter`` masks the whole formatted record, traceback included, so no code
path can put a secret value into server.log. ``OncePer`` lets a caller log an event at
most once per period for each key (a client address, say): a storm of bad requests
gives one line a period, with a count, never one line a request.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Callable

from .mask import TextMasker

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class MaskingFormatter(logging.Formatter):
    """A formatter whose output has every secret value replaced by its placeholder."""

    def __init__(self, masker: TextMasker, fmt: str = FORMAT) -> None:
        super().__init__(fmt)
        self.masker = masker

    def format(self, record: logging.LogRecord) -> str:  # noqa: A003 - logging's name
        return self.masker.mask(super().format(record))


def configure(masker: TextMasker, level: int = logging.INFO) -> None:
    """Log to stderr through ``MaskingFormatter``; uncaught exceptions go there too."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MaskingFormatter(masker))
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
