"""Break things on purpose: SIGKILL a session's actors or its sandbox, and wait on conditions.

    kill_actor(session, "runtime")     # the RuntimeProxy: the sandbox and its shell live on
    kill_actor(session, "controller")  # the agent loop: rebuilt from the log
    kill_actor(session, "session")     # the SessionSupervisor (and, with it, both children)
    kill_actor(session, "broker")      # the shared LLMBroker
    kill_sandbox(session)              # the sandbox server and its shell: in-flight work is lost
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..processes import children_of, pid_alive, start_time

if TYPE_CHECKING:
    from ..session import Session

SESSION_ROLES = frozenset({"runtime", "controller", "session"})
SHARED_ROLES = frozenset({"broker", "root"})
T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], timeout_s: float = 30.0, what: str = "condition",
    poll_s: float = 0.01,
) -> T:
    """Poll ``condition`` until it returns something truthy; return that.

    Raises TimeoutError naming ``what`` after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(poll_s)


def actor_pid(session: Session, role: str) -> int | None:
    """The pid of the live actor in ``role`` for ``session`` (None if none is published)."""
    if role not in SESSION_ROLES | SHARED_ROLES:
        raise ValueError(f"unknown role {role!r}; one of {sorted(SESSION_ROLES | SHARED_ROLES)}")
    home = session._trouper.home  # noqa: SLF001 - the harness is part of trouper
    path = home.actor_pid_path(role, session.id if role in SESSION_ROLES else None)
    try:
        pid_text, _, started_text = path.read_text().partition(" ")
        pid, started = int(pid_text), int(started_text or 0)
    except (OSError, ValueError):
        return None
    if started and start_time(pid) != started:
        return None  # that incarnation is gone and its pid went to another process
    return pid if pid_alive(pid) else None


def kill_actor(session: Session, role: str, timeout_s: float = 30.0) -> int:
    """SIGKILL the process of ``session``'s actor in ``role``; return its pid.

    Waits (up to ``timeout_s``) for the actor to be up first, so a kill right after a
    restart hits the new incarnation.
    """
    pid = wait_until(lambda: actor_pid(session, role), timeout_s, f"a live {role} actor")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), timeout_s, f"the {role} actor (pid {pid}) to die")
    return pid


def sandbox_pid(session: Session) -> int | None:
    """The pid of the session's local sandbox server, if it runs."""
    home = session._trouper.home  # noqa: SLF001
    try:
        info = json.loads((home.runtime_dir(session.id) / "server.json").read_text())
    except (OSError, ValueError):
        return None
    pid = int(info.get("pid", 0))
    return pid if pid and pid_alive(pid) else None


def kill_sandbox(session: Session, timeout_s: float = 30.0) -> int:
    """SIGKILL the session's sandbox server and its shell (what ran in it is lost)."""
    pid = wait_until(lambda: sandbox_pid(session), timeout_s, "a live sandbox server")
    groups = {_pgid(child) for child in children_of(pid)} | {_pgid(pid)}
    for group in groups - {None, os.getpgid(0)}:
        try:
            os.killpg(group, signal.SIGKILL)  # the server, its shell and the shell's jobs
        except ProcessLookupError:
            pass
    wait_until(lambda: not pid_alive(pid), timeout_s, f"the sandbox server (pid {pid}) to die")
    return pid


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
