"""The numbers that bound one client of an HTTP server, and the log of who passed them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..runtimes.sandbox.logs import OncePer

INT64_MAX = 2**63 - 1
"""The largest integer SQLite (and a file offset) holds: every number a request gives that
reaches a query or a seek is checked against it first."""
LOG_PERIOD_S = 60.0
"""A kind of trouble from one client address is logged at most once per this period."""


@dataclass(frozen=True)
class HttpLimits:
    """What one request, and one client, may cost a server."""

    max_body_bytes: int
    """Most bytes a request body may hold: a larger declared one is answered 413 unread,
    a chunked one is cut at the limit with 413."""
    max_header_bytes: int = 32 * 1024
    """Most bytes of a request line and its headers (431, or 400 when they never end)."""
    header_timeout_s: float = 10.0
    """A request's line and headers must all arrive within this, counted from their first
    byte (from the connection's opening for its first request): a trickler is dropped."""
    body_timeout_s: float = 10.0
    """A body gets this long, plus one second for each ``min_body_bytes_per_s`` that came:
    a large upload at a sane rate goes through, a trickled one is dropped."""
    min_body_bytes_per_s: int = 16 * 1024
    """The slowest average rate a body may arrive at once ``body_timeout_s`` has passed."""
    keep_alive_s: float = 5.0
    """An idle connection between two requests is closed after this."""
    max_connections: int = 256
    """Connections open at once; more are answered 503 and closed at once."""
    max_connections_per_client: int = 128
    """Connections open at once from one client address (on loopback every local client
    shares 127.0.0.1, so this is about the whole machine's share)."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "min_body_bytes_per_s",
                     "max_connections", "max_connections_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds")


class Notes:
    """Trouble from clients, logged at most once per ``period_s`` per kind and address,
    with the count of what was not logged since (a storm gives one line a minute)."""

    def __init__(self, logger: logging.Logger, period_s: float = LOG_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.period_s = period_s
        self._once = OncePer(period_s, clock)
        self.count = 0
        """Every note taken, logged or not (tests read it)."""

    def note(self, kind: str, host: str, detail: str) -> None:
        self.count += 1
        skipped = self._once.due(f"{kind} {host}")
        if skipped is None:
            return
        more = f" (and {skipped} more since the last such line)" if skipped else ""
        self.logger.warning("%s from %s: %s%s; logged at most once per %.0f s per address",
                            kind, host, detail, more, self.period_s)
