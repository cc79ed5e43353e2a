"""A supervisor hears of every dead child, however close together they die (I5 in
docs/promises.md).

Thespian 4.0.1 reaps, after a parent handled one child's exit, every other child that is
dead by then, and reports none of them (``actors/reaping.py``). A SessionSupervisor that
lost its Controller's death that way kept talking to a dead process and the session was
stuck for good (the chaos test in ``test_recovery.py``, now and then under load).

Here the losing order is made certain rather than waited for: the supervisor, while it
handles child ``a``'s exit, kills child ``b`` and waits until ``b`` is a zombie, so ``b`` is
dead when Thespian reaps after the handler. ``b`` must still be restarted.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from thespian.actors import Actor, ActorAddress, ActorExitRequest

from trouper.config.models import RestartPolicy
from trouper.host.processes import pid_alive
from trouper.supervisor import ChildSpec, Supervisor
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it


class Kid(Actor):
    """A child that tells the test it is up: ``("up", role, incarnation, pid)``."""

    def receiveMessage(self, msg: Any, sender: ActorAddress) -> None:  # noqa: N802
        if isinstance(msg, tuple) and msg[0] == "boot":
            _, reporter, role, incarnation = msg
            self.send(reporter, ("up", role, incarnation, os.getpid()))


def _zombie(pid: int) -> bool:
    """``pid`` has exited and waits to be reaped by its parent (this process)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return False


class TwoKids(Supervisor):
    """Supervises ``a`` and ``b``; while handling ``a``'s death it kills ``b`` (once)."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = RestartPolicy(backoff_initial_s=0.0)
        self.doomed = 0

    def _dispatch_own(self, msg: Any, sender: ActorAddress) -> None:
        if isinstance(msg, tuple) and msg[0] == "start":
            reporter = sender
            for role in ("a", "b"):
                self.supervise(ChildSpec(role, Kid, lambda n, r=role: ("boot", reporter, r, n)))
        elif isinstance(msg, tuple) and msg[0] == "doom":
            self.doomed = msg[1]
            self.send(sender, ("doomed",))
        else:
            super()._dispatch_own(msg, sender)

    def on_child_down(self, role: str, reason: str) -> None:
        if role == "a" and self.doomed:
            pid, self.doomed = self.doomed, 0
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not _zombie(pid) and time.monotonic() < deadline:
                os.sched_yield()  # a blocking wait on purpose: the losing order, made certain


Up = dict[tuple[str, int], int]


def _until_up(asys: Any, wanted: set[tuple[str, int]], timeout_s: float) -> Up:
    """Pids of the children in ``wanted`` ((role, incarnation)) once each said it is up."""
    seen: Up = {}
    deadline = time.monotonic() + timeout_s
    while not wanted <= seen.keys():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"still not up after {timeout_s:g} s: {wanted - seen.keys()} "
                               f"(up: {sorted(seen)})")
        msg = asys.listen(remaining)
        if isinstance(msg, tuple) and msg[0] == "up":
            seen[(msg[1], msg[2])] = msg[3]
    return seen


def test_a_child_dying_while_its_sibling_exit_is_handled_is_restarted(trouper):
    asys = trouper._system._asys  # noqa: SLF001 - the Trouper's own (sealed) system
    parent = asys.createActor(TwoKids)
    pids: list[int] = []
    try:
        asys.tell(parent, ("start",))
        first = _until_up(asys, {("a", 1), ("b", 1)}, 30)
        pids += first.values()
        assert asys.ask(parent, ("doom", first[("b", 1)]), 10) == ("doomed",)
        os.kill(first[("a", 1)], signal.SIGKILL)
        again = _until_up(asys, {("a", 2), ("b", 2)}, 10)  # b's death was heard too
        pids += again.values()
        assert not pid_alive(first[("b", 1)])
    finally:
        asys.tell(parent, ActorExitRequest())
        wait_until(lambda: not any(pid_alive(pid) for pid in pids), 10, "the children to exit")
