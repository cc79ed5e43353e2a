"""HTTP reading rules of the sandbox server: deadlines on reads, and body-length checks.

``DeadlineReader`` gives each request a total deadline, not a per-read timeout: a client
that trickles one byte every few seconds (slowloris) is dropped when the deadline passes,
however many reads it managed. ``body_length`` decides from the headers alone whether a
body may be read at all, so nothing past ``Content-Length`` or over the cap is read.
"""

from __future__ import annotations

import io
import math
import socket
import time
from email.message import Message


class DeadlineReader(io.RawIOBase):
    """Reads from a socket that fail with ``socket.timeout`` once ``deadline`` (monotonic
    seconds) has passed, in total over every read."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self.deadline = math.inf
        """When the bytes being read must have arrived (see ``start``)."""
        self.received = 0
        """Bytes read since the last ``start``."""

    def start(self, timeout_s: float) -> None:
        """What is read from now on must arrive within ``timeout_s``."""
        self.deadline = time.monotonic() + timeout_s
        self.received = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        left_s = self.deadline - time.monotonic()
        if left_s <= 0:
            raise socket.timeout("the request did not arrive within its deadline")
        self._sock.settimeout(left_s)
        count = self._sock.recv_into(buffer)
        self.received += count
        return count


class Refusal(Exception):
    """A request refused from its headers: an HTTP status, an error name, a message."""

    def __init__(self, status: int, name: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.name = name


def body_length(headers: Message, method: str, max_bytes: int) -> int:
    """How many body bytes to read; Refusal when the headers do not allow reading it.

    POST needs one ``Content-Length`` (411 without, 400 if malformed or repeated, 413 over
    ``max_bytes``); chunked bodies are not accepted (411). Other methods may omit it.
    """
    if headers.get("Transfer-Encoding") is not None:
        raise Refusal(411, "LengthRequired", "send the body with a Content-Length, not chunked")
    values = headers.get_all("Content-Length") or []
    if not values:
        if method == "POST":
            raise Refusal(411, "LengthRequired", "a POST needs a Content-Length header")
        return 0
    text = values[0].strip()
    if len(set(values)) > 1 or not text.isdigit() or not text.isascii():
        raise Refusal(400, "BadRequest", f"invalid Content-Length {', '.join(values)!r}")
    length = int(text)
    if length > max_bytes:
        raise Refusal(
            413, "PayloadTooLarge", f"the body has {length} bytes; the limit is {max_bytes}"
        )
    return length
