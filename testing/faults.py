"""Break things on purpose: SIGKILL a session's actors or its sandbox, and wait on conditions.

    kill_actor(session, "runtime")     # the RuntimeProxy: the sandbox and its shell live on
    kill_actor(session, "controller")  # the agent loop: rebuilt from the log
    kill_actor(session, "session")     # the SessionSupervisor (and, with it, both children)
    kill_actor(session, "broker")      # the shared LLMBroker
    kill_sandbox(session)              # the sandbox server and its shell: in-flight work is lost
    kill(session, what)                # any of the above by name ("sandbox" or a role)
    with hang(session, what) as pid:   # SIGSTOP it instead: a hung process, found by probes
        ...
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..host.processes import pid_alive, published_pid, signal_quietly, start_time
from ..runtimes import Sandbox, load_sandbox
from ..runtimes.local import LocalSandbox
from ..security.secrets_file import read_runtime_token, with_runtime_token

if TYPE_CHECKING:
    from ..client.session import Session

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
    return published_pid(home.actor_pid_path(role, session.id if role in SESSION_ROLES
                                             else None))


def kill_actor(session: Session, role: str, timeout_s: float = 30.0) -> int:
    """SIGKILL the process of ``session``'s actor in ``role``; return its pid.

    Waits (up to ``timeout_s``) for the actor to be up first, so a kill right after a
    restart hits the new incarnation.
    """
    pid = wait_until(lambda: actor_pid(session, role), timeout_s, f"a live {role} actor")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), timeout_s, f"the {role} actor (pid {pid}) to die")
    return pid


def sandbox_of(session: Session) -> Sandbox:
    """A fresh backend object for ``session``'s sandbox, through the runtime interface
    (``Sandbox.running``, ``Sandbox.kill``): the harness reads no backend's files."""
    home = session._trouper.home  # noqa: SLF001 - the harness is part of trouper
    # the store holds no runtime token: put it back from the session's secrets file
    config = with_runtime_token(session.record.config, read_runtime_token(home, session.id))
    return load_sandbox(config.runtime, session_id=session.id,
                        workspace=Path(config.workspace), state_dir=home.runtime_dir(session.id))


def sandbox_pid(session: Session) -> int | None:
    """The pid of the session's local sandbox server, if it runs (local runtime only)."""
    sandbox = sandbox_of(session)
    return sandbox.server_pid() if isinstance(sandbox, LocalSandbox) else None


def kill_sandbox(session: Session, timeout_s: float = 30.0) -> int | str:
    """Crash the session's sandbox (its server, its shell and the shell's jobs: what ran
    in it is lost); waits for one to run first. What was killed (a pid for local)."""
    sandbox = sandbox_of(session)
    killed = wait_until(sandbox.kill, timeout_s, "a live sandbox")

    def gone() -> bool:
        if isinstance(killed, int):  # that server: its proxy, waiting on its exit, may
            return not pid_alive(killed)  # have a replacement running already
        return not sandbox.running()

    wait_until(gone, timeout_s, f"the sandbox ({killed}) to die")
    return killed


def kill(session: Session, what: str, timeout_s: float = 30.0) -> int | str:
    """``kill_sandbox`` for ``"sandbox"``, else ``kill_actor`` of the role ``what``: one
    call for a chaos loop that picks its victim at random. Raises TimeoutError as they do
    (nothing of that kind came up within ``timeout_s``)."""
    if what == "sandbox":
        return kill_sandbox(session, timeout_s)
    return kill_actor(session, what, timeout_s)



@contextlib.contextmanager
def hang(session: Session, what: str, timeout_s: float = 30.0) -> Iterator[int]:
    """SIGSTOP the process of ``what`` (a role, or ``"sandbox"``: the local sandbox
    server), as a deadlock would leave it, and yield its pid; waits for one to run first.

    trouper finds a hung process by probing it and SIGKILLs it (``docs/operations.md``, "A
    hung process"), so a test waits for that inside the block; on leaving, a process still
    stopped (the same one: its start time is checked) is continued with SIGCONT.
    """
    if what == "sandbox":
        pid = wait_until(lambda: sandbox_pid(session), timeout_s, "a live local sandbox server")
    else:
        pid = wait_until(lambda: actor_pid(session, what), timeout_s, f"a live {what} actor")
    started = start_time(pid)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        if pid_alive(pid) and start_time(pid) == started:
            signal_quietly(pid, signal.SIGCONT)
