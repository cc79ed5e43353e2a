"""``Background``: blocking work on worker threads, its results back on the actor's thread.

An actor never blocks in a handler (docs/promises.md, "Thespian, the rules that bite"): it
submits the work here, watches ``fileno`` (returned in ``ThespianWatch``), and calls
``drain`` when Thespian says the pipe is readable.
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

logger = logging.getLogger(__name__)


class Background:
    """Runs blocking calls on worker threads; results come back on the actor's thread.

    A worker puts ``(callback, result, error)`` on a queue and writes one byte to a pipe;
    the actor watches the pipe's read end and, on ``WatchMessage``, calls ``drain``.
    """

    def __init__(self, max_workers: int = 32) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._done: queue.SimpleQueue[tuple[Callable[..., None], Any, BaseException | None]] = (
            queue.SimpleQueue()
        )
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="trouper")
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def fileno(self) -> int:
        return self._read_fd

    def submit(
        self,
        work: Callable[[], Any],
        on_done: Callable[[Any, BaseException | None], None],
    ) -> None:
        """Run ``work()`` on a thread; ``on_done(result, error)`` runs later on the actor."""
        self._pool.submit(self._run, work, on_done)

    def _run(self, work: Callable[[], Any], on_done: Callable[..., None]) -> None:
        try:
            result, error = work(), None
        except BaseException as exc:  # noqa: BLE001 - handed to the actor as data
            result, error = None, exc
        self._done.put((on_done, result, error))
        if not self._closed:
            try:
                os.write(self._write_fd, b"x")
            except OSError:
                logger.debug("background pipe closed before a result was signalled")

    def drain(self) -> None:
        """Call the callbacks of finished work, on the caller's (the actor's) thread."""
        if self._closed:
            return  # the actor is exiting: its pipe is gone and nobody waits for results
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                on_done, result, error = self._done.get_nowait()
            except queue.Empty:
                return
            on_done(result, error)

    def close(self) -> None:
        """Stop taking work; running threads finish on their own. Idempotent.

        The pipe stays open until the process ends: Thespian handles an exit request
        without taking the actor's new watch list, and keeps watching the read end while
        it drains; closed, its number could be reused by a file, and epoll fails on that
        (EPERM, a traceback on the program's stderr)."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
