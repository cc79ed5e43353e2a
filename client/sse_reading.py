"""The client's side of the daemon's Server-Sent Events: the lines parsed into messages,
and a stream cut as soon as its reader is told to stop.

A stream waits in a blocking read between events, and the daemon sends a heartbeat only
every 15 s: a ``stop`` checked between messages would end a quiet stream 15 s late,
where the embedded ``Session.events`` ends within its 0.1 s poll. ``cut_when_set``
shuts the connection's socket down once ``stop`` is set, which wakes the read at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx

logger = logging.getLogger(__name__)

STOP_POLL_S = 0.1
"""How often a followed stream looks at its ``stop`` (the embedded store's poll)."""


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` of each SSE message ("message" when unnamed), and
    ``("comment", {})`` for each comment (the daemon's heartbeats); ``retry:`` and ``id:``
    lines are skipped (the data carries the seq)."""
    kind, data = "message", []
    for line in lines:
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith(":"):
            yield "comment", {}
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                kind = value
            elif name == "data":
                data.append(value)


@contextlib.contextmanager
def cut_when_set(stop: threading.Event | None, answer: httpx.Response) -> Iterator[None]:
    """While the block reads ``answer``, shut its socket down once ``stop`` is set (the
    read then ends as a dropped stream); the watching thread ends with the block."""
    if stop is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if stop.wait(STOP_POLL_S):
                _shut_down(answer)
                return

    watcher = threading.Thread(target=watch, name="sse-stop", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


def _shut_down(answer: httpx.Response) -> None:
    """Wake a read blocked on ``answer``'s connection: ``shutdown``, unlike ``close``,
    ends a ``recv`` another thread is in."""
    stream = answer.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError as exc:  # already closed: the read has ended anyway
        logger.debug("stream's socket not shut down: %s", exc)


__all__ = ["STOP_POLL_S", "cut_when_set", "parse_sse"]
