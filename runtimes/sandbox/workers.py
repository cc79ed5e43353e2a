"""Threads that perform actions: kept once made, so a step makes no thread.

A new thread per action cost, every step, a ``clone``, an 8 MB stack mapped and given
back (``madvise``) and the interpreter's set-up of a thread. ``Workers`` keeps the
threads it made and makes one only when none is idle, so as many actions as ever can
run at once (a command left running past its soft timeout, a file read beside it) and
a step reuses a thread. The threads are daemons, as the per-action ones were: a command
that never ends cannot hold the server's exit.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Tuple

Job = Tuple[Callable[..., Any], Tuple[Any, ...], threading.Event]


logger = logging.getLogger(__name__)


class Workers:
    """Run jobs on kept daemon threads."""

    def __init__(self, name: str = "action-worker") -> None:
        self.name = name
        self._running: set[threading.Event] = set()
        """One event per job not done yet, set when it is."""
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._made = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> threading.Event:
        """Run ``fn(*args)`` on an idle thread, or a new one if none is idle; the event is
        set once it returned (or raised: the job's own business to report)."""
        done = threading.Event()
        with self._lock:
            self._running.add(done)
            make = self._idle == 0
            if make:
                self._made += 1
            else:
                self._idle -= 1  # that idle thread takes this job
        self._jobs.put((fn, args, done))
        if make:
            threading.Thread(target=self._work, name=f"{self.name}-{self._made}",
                             daemon=True).start()
        return done

    def running(self) -> list[threading.Event]:
        """The events of the jobs not done yet (``Service.close`` waits on them)."""
        with self._lock:
            return list(self._running)

    @property
    def threads(self) -> int:
        """How many threads were made (none is ever let go)."""
        return self._made

    def _work(self) -> None:
        while True:
            fn, args, done = self._jobs.get()
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a job reports its own; this is a bug
                logger.exception("an action's thread failed")
            finally:
                with self._lock:
                    self._running.discard(done)
                    self._idle += 1
                done.set()
