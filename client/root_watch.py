"""The program supervises its root actor: a root that dies is started again.

Every actor in the tree has a supervisor except the root, which the program creates
through Thespian's admin. A root that died (SIGKILL, the OOM killer) took the broker and
every session process with it (they die with their parent), and nothing started them
again: every session stood still, and every request from the program timed out, until
the program itself was restarted. ``RootWatch`` waits on the root's pidfd in a thread of
the program (no polling: it wakes only when the root exits) and then has the
``ActorSystemHandle`` create and boot a new root and resume every session that was
working, as a program that opens again does (the sandboxes outlive it; what was in flight
is asked of their journals). A root that hangs instead is found when a request to it
times out: the handle probes it, and kills one that does not answer
(``ActorSystemHandle._ask``), so that this watch starts a new one.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable

from ..host.processes import exit_watch

logger = logging.getLogger(__name__)


class RootWatch:
    """Calls ``died()`` (in its own thread) when the watched root process exits."""

    def __init__(self, died: Callable[[], None]) -> None:
        self._died = died
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = None

    def watch(self, pid: int) -> bool:
        """Watch the root ``pid`` from now on; False when it cannot be watched (no pidfd,
        or it is gone already)."""
        fd = exit_watch(pid)
        if fd is None:
            logger.warning("cannot watch the root actor (pid %d): a root that dies will not "
                           "be started again", pid)
            return False
        self._thread = threading.Thread(target=self._wait, args=(fd, pid), daemon=True,
                                        name="trouper-root-watch")
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop watching (the program closes the tree: the root's exit is wanted)."""
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        for fd in (self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _wait(self, fd: int, pid: int) -> None:
        try:
            ready, _, _ = select.select([fd, self._stop_r], [], [])
        except (OSError, ValueError):  # closed under it: stopped
            return
        finally:
            os.close(fd)
        if self._stop_r in ready:
            return
        logger.warning("the root actor (pid %d) is gone; starting a new one", pid)
        try:
            self._died()
        except Exception:  # noqa: BLE001 - a thread's last resort: say why, in the log
            logger.exception("starting a new root actor failed")
