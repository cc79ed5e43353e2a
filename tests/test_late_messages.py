"""I5/I6: late, out-of-order and meaningless messages never crash an actor or start an action.

The Controller runs in Thespian's in-process ``simpleSystemBase`` (fine for message
handling, per docs/promises.md), on a real store in a temp home; its broker and runtime are a
sink that records what it is sent.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest
from thespian.actors import Actor, ActorSystem, WakeupMessage

from trouper.actors import base
from trouper.actors.controller import Controller
from trouper.config.models import LLMConfig, SessionConfig
from trouper.core.fold import SessionView
from trouper.home.paths import Home
from trouper.messages.events import AgentState
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import (
    Accepted,
    Complete,
    Completed,
    Execute,
    Executed,
    JournalFault,
    Resolved,
    RuntimeFailed,
    RuntimeReady,
    StartSession,
    ToolCall,
    UserCommand,
)
from trouper.messages.tree import (
    BootController,
    CommandAnswered,
    Relay,
    Rewire,
    RuntimeGaveUp,
)
from trouper.store import open_store, store_url


class Sink(Actor):
    """Stands in for the broker and the runtime: keeps what it is sent."""

    seen: ClassVar[list[Any]] = []

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802
        Sink.seen.append(msg)


class Parent(Actor):
    """The Controller's parent, as the root is: boots it (``(controller, boot)``), and
    passes each answer that comes up (``CommandAnswered``) on to who asked."""

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802
        if isinstance(msg, tuple):
            self.send(*msg)
        elif isinstance(msg, CommandAnswered) and msg.reply_to is not None:
            self.send(msg.reply_to, msg.answer)


def _boot_under_parent(asys: ActorSystem, controller: Any, boot: BootController) -> None:
    asys.tell(asys.createActor(Parent), (controller, boot))


@pytest.fixture
def system(monkeypatch):
    monkeypatch.setattr(base, "die_with_parent", lambda: None)  # this is the test process
    monkeypatch.setattr(base, "name_process", lambda name: None)  # and keeps its name
    Sink.seen = []
    name = Path("/proc/self/comm").read_text()
    asys = ActorSystem("simpleSystemBase", transientUnique=True)
    yield asys
    asys.shutdown()
    # a worker named trouper-ctl passed for a Controller with tools that find them by name
    assert Path("/proc/self/comm").read_text() == name


def _with_store(home: Home, use: Any) -> Any:
    """``use(store)`` on a store closed again afterwards (no connection left open)."""
    store = open_store(home)
    try:
        return use(store)
    finally:
        store.close()


def _stored_session(home: Home, workspace: str) -> StartSession:
    """A new session in ``home``'s store, and the start its Controller is booted with."""
    session_id = "s-" + uuid.uuid4().hex[:8]
    config = SessionConfig(task="t", llm=LLMConfig(model="hosted_vllm/x"), workspace=workspace)
    _with_store(home, lambda store: store.create_session(session_id, config))
    return StartSession(request_id="boot", session_id=session_id, config=config,
                        home=str(home.root), store_url=store_url(home))


def _boot(asys: ActorSystem, home: Home, workspace: str) -> tuple[Any, str]:
    start = _stored_session(home, workspace)
    session_id = start.session_id
    sink = asys.createActor(Sink)
    controller = asys.createActor(Controller)
    _boot_under_parent(asys, controller, BootController(start=start, broker=sink,
                                                        runtime=sink, reply_to=None))
    asys.tell(controller, RuntimeReady(session_id=session_id, epoch=1, attached=False))
    return controller, session_id


def _command(asys: ActorSystem, controller: Any, session_id: str, command: str) -> Any:
    """Relay a user command; the answer goes to a sink, returned here."""
    cmd = UserCommand(request_id=uuid.uuid4().hex, session_id=session_id, command=command)
    answers = asys.createActor(Sink)
    asys.tell(controller, Relay(msg=cmd, reply_to=answers))
    replies = [m for m in Sink.seen if getattr(m, "request_id", None) == cmd.request_id]
    return replies[-1] if replies else None


def _view(home: Home, session_id: str) -> SessionView:
    return SessionView.of(_with_store(home, lambda store: store.read(session_id)))


def test_late_and_meaningless_messages_change_nothing(system, tmp_path):
    home = Home.at(tmp_path / "home")
    controller, sid = _boot(system, home, str(tmp_path))
    asked = [m for m in Sink.seen if isinstance(m, Complete)]
    assert len(asked) == 1  # RUNNING: it asked the model once
    late = [
        Completed(request_id="not-ours", session_id=sid, content="stale"),
        Executed(session_id=sid, action_id="nobody", outcome=Outcome(status="ok", content="late")),
        Resolved(session_id=sid, action_id="nobody", state="finished",
                 outcome=Outcome(status="ok", content="late")),
        JournalFault(session_id=sid, action_id="nobody", cause="full"),
        RuntimeReady(session_id=sid, epoch=1, attached=True),
        WakeupMessage(1, payload="no such timer"),
        {"kind": "nonsense"},
        "a string",
        12345,
    ]
    for msg in late:
        system.tell(controller, msg)
    view = _view(home, sid)
    assert view.state == AgentState.RUNNING and view.pending == {} and view.actions == 0
    # the controller still answers, and nothing ran
    assert isinstance(_command(system, controller, sid, "pause"), Accepted)
    assert not [m for m in Sink.seen if isinstance(m, Execute)]


def test_a_reply_after_the_session_left_running_starts_no_action(system, tmp_path):
    home = Home.at(tmp_path / "home")
    controller, sid = _boot(system, home, str(tmp_path))
    request = [m for m in Sink.seen if isinstance(m, Complete)][-1]
    system.tell(controller, RuntimeFailed(session_id=sid, epoch=1, cause="exited",
                                          detail="killed"))
    system.tell(controller, RuntimeGaveUp(reason="the sandbox failed 6 times; resume"))
    call = ToolCall(id="c1", name="run", arguments='{"command": "echo late"}')
    system.tell(controller, Completed(request_id=request.request_id, session_id=sid,
                                      tool_calls=[call]))
    view = _view(home, sid)
    assert view.state == AgentState.ERROR
    assert view.actions == 0 and view.pending == {}  # I5: no action without an outcome
    assert not [m for m in Sink.seen if isinstance(m, Execute)]


def test_no_broker_yet_is_no_crash(system, tmp_path):
    """A Controller whose broker is being restarted asks once the new one is wired."""
    home = Home.at(tmp_path / "home")
    start = _stored_session(home, str(tmp_path))
    session_id = start.session_id
    sink = system.createActor(Sink)
    controller = system.createActor(Controller)
    _boot_under_parent(system, controller, BootController(start=start, broker=None,
                                                          runtime=sink))
    system.tell(controller, RuntimeReady(session_id=session_id, epoch=1, attached=False))
    assert not [m for m in Sink.seen if isinstance(m, Complete)]
    system.tell(controller, Rewire(broker=sink, reason="the broker is back"))
    assert len([m for m in Sink.seen if isinstance(m, Complete)]) == 1
    assert isinstance(_command(system, controller, session_id, "pause"), Accepted)


def test_inputs_that_overtake_the_boot_are_handled_after_it(system, tmp_path):
    """Thespian does not promise that a parent's messages reach a new child in the order
    sent: a user's command (a ``resume`` right after its session was accepted) and the
    sandbox's readiness can come before the Controller's boot. They are kept and handled
    once it is up, in order: the command answered, the session running."""
    home = Home.at(tmp_path / "home")
    start = _stored_session(home, str(tmp_path))
    session_id = start.session_id
    sink, answers = system.createActor(Sink), system.createActor(Sink)
    controller = system.createActor(Controller)
    cmd = UserCommand(request_id=uuid.uuid4().hex, session_id=session_id, command="send",
                      text="hello")
    system.tell(controller, Relay(msg=cmd, reply_to=answers))
    system.tell(controller, RuntimeReady(session_id=session_id, epoch=1, attached=False))
    assert not [m for m in Sink.seen if getattr(m, "request_id", None) == cmd.request_id]
    _boot_under_parent(system, controller, BootController(start=start, broker=sink,
                                                          runtime=sink, reply_to=None))
    replies = [m for m in Sink.seen if getattr(m, "request_id", None) == cmd.request_id]
    assert len(replies) == 1 and isinstance(replies[0], Accepted), replies
    assert _view(home, session_id).state == AgentState.RUNNING
    assert [m for m in Sink.seen if isinstance(m, Complete)]  # it asked the model
