"""A cheaper selector for Thespian's TCP transport loop.

Thespian's ``TCPTransport._runWithExpiry`` builds a new ``selectors.DefaultSelector()`` on
every turn of every actor's loop: on Linux an epoll instance, one ``epoll_ctl`` per socket
and a ``close``, four to eight system calls and their Python wrappers per message hop (the
bench's profile put ~15% of a Controller's CPU there). ``LoopSelector`` answers the same
calls with one ``poll(2)``: registering is a dict entry, closing is nothing.

Semantics Thespian relies on are kept: ``select`` returns ``(key, events)`` pairs whose
``key.fd`` is the descriptor, a descriptor registered for reading and writing is polled
for both, and a closed descriptor raises ``OSError(EBADF)`` (epoll raised it at
``register``; poll reports it per descriptor), so Thespian's search for a bad watched
descriptor still runs.
"""

from __future__ import annotations

import errno
import inspect
import math
import select
import selectors
import types
from typing import Any, NamedTuple

from thespian.system.transport import TCPTransport

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE
_IN = select.POLLIN | select.POLLPRI
_OUT = select.POLLOUT
_DONE = select.POLLHUP | select.POLLERR


class _Key(NamedTuple):
    fd: int


class LoopSelector:
    """One turn of the transport loop: register, ``select`` once, ``close``."""

    def __init__(self) -> None:
        self._events: dict[int, int] = {}

    def register(self, fd: Any, events: int, data: Any = None) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        if fd < 0:
            raise ValueError(f"invalid file descriptor {fd}")
        self._events[fd] = self._events.get(fd, 0) | events

    def select(self, timeout: float | None = None) -> list[tuple[_Key, int]]:
        poller = select.poll()
        for fd, events in self._events.items():
            poller.register(fd, (_IN if events & EVENT_READ else 0)
                            | (_OUT if events & EVENT_WRITE else 0))
        wait_ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        ready = []
        for fd, revents in poller.poll(wait_ms):
            if revents & select.POLLNVAL:
                raise OSError(errno.EBADF, f"file descriptor {fd} is not open")
            wanted = self._events[fd]
            got = 0
            if wanted & EVENT_READ and revents & (_IN | _DONE):
                got |= EVENT_READ
            if wanted & EVENT_WRITE and revents & (_OUT | _DONE):
                got |= EVENT_WRITE
            if got:
                ready.append((_Key(fd), got))
        return ready

    def close(self) -> None:
        self._events.clear()


_SHIM = types.SimpleNamespace(DefaultSelector=LoopSelector, EVENT_READ=EVENT_READ,
                              EVENT_WRITE=EVENT_WRITE)


def install() -> bool:
    """Give the transport ``LoopSelector`` (idempotent). False, changing nothing, when
    Thespian no longer builds its selector the way this replaces."""
    if TCPTransport.selectors is _SHIM:
        return True
    loop = inspect.getsource(TCPTransport.TCPTransport._runWithExpiry)
    if "selectors.DefaultSelector()" not in loop or not hasattr(select, "poll"):
        return False
    TCPTransport.selectors = _SHIM  # type: ignore[attr-defined]
    return True
