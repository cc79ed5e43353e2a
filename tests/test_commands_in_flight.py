"""A user's command whose taker dies before it answers is carried out once, not lost.

The root and the SessionSupervisor keep each command they handed
on until the agent loop says it answered (``CommandAnswered``), and hands the unanswered
ones to the loop's next incarnation, which answers one already in its log without
carrying it out again (``actors/in_flight.py``). Driven in Thespian's in-process simple
system with a real Controller on a real store; the taker "dies" by exiting where the test
says: before it takes the command, or after its events are in the log and before it
answers. ``test_recovery.py`` does the same to real processes with SIGKILL.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tree's fakes (pytest imports by path)
from test_late_messages_tree import (  # noqa: E402
    Courier,
    FakeRoot,
    FakeSession,
    RecordedController,
    Root,
    _start,
    drops,  # noqa: F401 - a fixture
    system,  # noqa: F401 - a fixture
)
from thespian.actors import ActorExitRequest  # noqa: E402

from trouper.actors.controller import utc_now
from trouper.actors.in_flight import HANDED_AT_MOST
from trouper.config.models import RestartPolicy
from trouper.core.effects import Append
from trouper.home.paths import Home
from trouper.messages.events import MessageEvent
from trouper.messages.protocol import Accepted, Refused, UserCommand
from trouper.messages.tree import BootRoot, Relay
from trouper.store import open_store


class DyingController(RecordedController):
    """A real Controller that dies holding a command, as ``plan`` says for each one:
    ``"before"`` it takes it, or ``"after"`` it is in the log and before it answers."""

    plan: ClassVar[list[str]] = []

    def on_relay(self, msg: Relay, sender: Any) -> None:
        if not DyingController.plan:
            super().on_relay(msg, sender)
            return
        if DyingController.plan.pop(0) == "after":
            assert self.core is not None
            effects = self.core.handle(msg.msg, utc_now())
            self.perform([e for e in effects if isinstance(e, Append)])  # no answer
        self.send(self.myAddress, ActorExitRequest())


class DyingSession(FakeSession):
    """A session whose supervisor dies before it hands on the next ``plan`` commands."""

    controller_class = DyingController
    plan: ClassVar[int] = 0

    def on_relay(self, msg: Relay, sender: Any) -> None:
        if DyingSession.plan:
            DyingSession.plan -= 1
            self.send(self.myAddress, ActorExitRequest())  # its Controller goes with it
            return
        super().on_relay(msg, sender)


class DyingSplitRoot(FakeRoot):
    session_class = DyingSession


@pytest.fixture
def plans():
    DyingController.plan, DyingSession.plan = [], 0
    yield
    DyingController.plan, DyingSession.plan = [], 0


def _session(asys: Any, tmp_path: Any) -> tuple[Root, str]:
    root = Root(asys, Home.at(tmp_path / "home"), tmp_path, root_class=DyingSplitRoot)
    policy = RestartPolicy(backoff_initial_s=0)  # every restart at once: no timer to wait
    boot = BootRoot(home=str(root.home.root), policy=policy)
    assert isinstance(root.ask(boot), Accepted)
    start = _start(root.home, tmp_path)
    assert isinstance(root.ask(start), Accepted)
    assert len(RecordedController.booted) == 1
    return root, start.session_id


def _send(root: Root, session_id: str, text: str, request_id: str) -> list[Any]:
    """Send ``text`` and return every answer the client got for it."""
    root.tell(UserCommand(request_id=request_id, session_id=session_id, command="send",
                          text=text), via=root.client)
    return [m for to, m in Courier.seen
            if to == root.client and getattr(m, "request_id", None) == request_id]


def _user_messages(root: Root, session_id: str) -> list[str]:
    store = open_store(root.home)
    try:
        return [e.text for e in store.read(session_id)
                if isinstance(e, MessageEvent) and e.source == "user"]
    finally:
        store.close()


@pytest.mark.parametrize("dies", ["before", "after"])
def test_a_command_whose_taker_dies_is_answered_once_and_carried_out_once(
        system, plans, tmp_path, dies):  # noqa: F811
    root, sid = _session(system, tmp_path)
    DyingController.plan = [dies]
    answers = _send(root, sid, "again", "r-1")
    assert len(answers) == 1 and isinstance(answers[0], Accepted), answers
    assert len(RecordedController.booted) == 2  # restarted once, and it took the command
    assert _user_messages(root, sid) == ["t", "again"]


def test_a_supervisor_that_dies_before_it_hands_a_command_on_gets_it_again(
        system, plans, tmp_path):  # noqa: F811
    root, sid = _session(system, tmp_path)
    DyingSession.plan = 1
    answers = _send(root, sid, "again", "r-1")
    assert len(answers) == 1 and isinstance(answers[0], Accepted), answers
    assert _user_messages(root, sid) == ["t", "again"]


def test_a_command_whose_takers_keep_dying_is_refused_and_the_session_goes_on(
        system, plans, tmp_path):  # noqa: F811
    """Handed to two incarnations at most: a command that kills its taker is refused,
    saying the log tells whether it was done, rather than restarting it without end."""
    root, sid = _session(system, tmp_path)
    DyingController.plan = ["after"] * HANDED_AT_MOST
    answers = _send(root, sid, "poison", "r-1")
    assert len(answers) == 1 and isinstance(answers[0], Refused), answers
    assert "went down while it took this command" in answers[0].message
    assert "log shows whether it was carried out" in answers[0].message
    assert len(RecordedController.booted) == 1 + HANDED_AT_MOST
    assert _user_messages(root, sid) == ["t", "poison"]  # once: the second one found it
    answers = _send(root, sid, "next", "r-2")
    assert len(answers) == 1 and isinstance(answers[0], Accepted), answers
    assert _user_messages(root, sid) == ["t", "poison", "next"]


def test_an_answered_command_is_not_handed_to_the_next_taker(
        system, plans, tmp_path):  # noqa: F811
    root, sid = _session(system, tmp_path)
    assert isinstance(_send(root, sid, "once", "r-1")[0], Accepted)
    system.tell(RecordedController.booted[-1], ActorExitRequest())
    assert len(RecordedController.booted) == 2
    assert len(_send(root, sid, "later", "r-2")) == 1
    answers = [m for to, m in Courier.seen if to == root.client
               and getattr(m, "request_id", None) == "r-1"]
    assert len(answers) == 1, answers
    assert _user_messages(root, sid) == ["t", "once", "later"]
