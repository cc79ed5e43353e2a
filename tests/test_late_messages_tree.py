"""I5/I6 (docs/promises.md) for the supervisors: every handler of the SessionSupervisor and
the root is total.

Each is driven with messages before its boot, its own protocol out of order or twice, and
junk; after each batch it must still answer, must have started nothing, and must have
logged one line per message it dropped. They run in Thespian's in-process
``simpleSystemBase`` (when ``tell`` returns, every message it caused has been handled),
with a real Controller on a real store, a fake runtime proxy that runs nothing, and
couriers standing in for the broker, the parent, a client and a stranger. The
RuntimeProxy and the LLMBroker are in ``test_late_messages_procs.py``, the Controller in
``test_late_messages.py``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from thespian.actors import (
    Actor,
    ActorExitRequest,
    ActorSystem,
    ChildActorExited,
    WakeupMessage,
)

from trouper.actors import base
from trouper.actors.base import Timer, describe
from trouper.actors.controller import Controller
from trouper.actors.root import RootSupervisor
from trouper.actors.session_supervisor import SessionSupervisor
from trouper.config.models import LLMConfig, RestartPolicy, SessionConfig
from trouper.core.fold import SessionView
from trouper.home.paths import Home
from trouper.messages.events import AgentState, StateChanged, Why
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import (
    Accepted,
    CloseSandbox,
    Complete,
    Completed,
    Execute,
    Executed,
    FaultQuery,
    FaultStatus,
    Refused,
    Resolved,
    RuntimeFailed,
    RuntimeReady,
    SandboxClosed,
    StartSession,
    StoreFault,
    UserCommand,
)
from trouper.messages.tree import (
    BootBroker,
    BootController,
    BootedUp,
    BootGroup,
    BootRoot,
    BootRuntime,
    BrokerMoved,
    BrokerSlow,
    CloseFor,
    CommandAnswered,
    Failing,
    ProbeAnswer,
    RecordDowntime,
    Relay,
    RestartRuntime,
    Shutdown,
    ShutdownDone,
    StandDown,
    StandingDown,
    SteppedDown,
    Superseded,
    WatchSession,
    Working,
)
from trouper.store import open_store, store_url
from trouper.testing import wait_until


@dataclass(frozen=True)
class Deliver:
    """Tell a courier to send ``msgs`` to ``to`` in one go, so they come *from* it."""

    to: Any
    msgs: tuple[Any, ...]


@dataclass(frozen=True)
class Forged:
    """A message whose kind names one of an actor's hooks, not one of its handlers."""

    kind: str


class Courier(Actor):
    """A parent, broker, client or stranger: keeps what it is sent, delivers what it is told."""

    seen: ClassVar[list[tuple[Any, Any]]] = []

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802
        if isinstance(msg, Deliver):
            for one in msg.msgs:
                self.send(msg.to, one)
        else:
            Courier.seen.append((self.myAddress, msg))


class FakeRuntime(Actor):
    """The RuntimeProxy's place: ready at once, closes at once, runs nothing."""

    seen: ClassVar[list[Any]] = []
    booted: ClassVar[list[Any]] = []

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802
        FakeRuntime.seen.append(msg)
        if isinstance(msg, BootRuntime):
            self.session_id = msg.start.session_id
            FakeRuntime.booted.append(self.myAddress)
            self.send(sender, RuntimeReady(session_id=self.session_id,
                                           epoch=len(FakeRuntime.booted), attached=False))
        elif isinstance(msg, CloseSandbox):
            self.send(sender, SandboxClosed(request_id=msg.request_id,
                                            session_id=self.session_id))


class RecordedController(Controller):
    """The real Controller, telling the test where it lives."""

    booted: ClassVar[list[Any]] = []

    def on_boot_controller(self, msg: BootController, sender: Any) -> None:
        RecordedController.booted.append(self.myAddress)
        super().on_boot_controller(msg, sender)


class FakeSession(SessionSupervisor):
    runtime_class = FakeRuntime
    controller_class = RecordedController


class FakeRoot(RootSupervisor):
    broker_class = Courier
    session_class = FakeSession


@pytest.fixture
def system(monkeypatch):
    monkeypatch.setattr(base, "die_with_parent", lambda: None)  # this is the test process
    monkeypatch.setattr(base, "name_process", lambda name: None)  # and keeps its name
    Courier.seen, FakeRuntime.seen, FakeRuntime.booted = [], [], []
    RecordedController.booted = []
    asys = ActorSystem("simpleSystemBase", transientUnique=True)
    yield asys
    asys.shutdown()


@pytest.fixture
def drops(caplog):
    """``drops()``: the log records of messages dropped since the last call."""
    caplog.set_level(logging.INFO, logger="trouper")
    counted = [0]

    def new() -> list[logging.LogRecord]:
        found = [r for r in caplog.records if hasattr(r, "dropped")]
        fresh, counted[0] = found[counted[0]:], len(found)
        return fresh

    return new


def _one_line_each(records: list[logging.LogRecord], sent: list[Any]) -> None:
    """One drop line per message sent, in the order sent (a wakeup is named by its timer)."""
    named = [describe(m.payload if isinstance(m, WakeupMessage) else m) for m in sent]
    assert [r.dropped for r in records] == named  # type: ignore[attr-defined]


def _start(home: Home, workspace: Path) -> StartSession:
    session_id = "s-" + uuid.uuid4().hex[:8]
    config = SessionConfig(task="t", llm=LLMConfig(model="hosted_vllm/x"),
                           workspace=str(workspace))
    store = open_store(home)
    try:
        store.create_session(session_id, config)
    finally:
        store.close()
    return StartSession(request_id="boot-" + session_id, session_id=session_id,
                        config=config, home=str(home.root),
                        store_url=store_url(home))


def _junk(session_id: str) -> list[Any]:
    """What no actor of the tree can use: plain values, another actor's protocol, forgeries."""
    ok = Outcome(status="ok", content="late")
    return [
        {"kind": "relay"}, "a string", 12345,
        Executed(session_id=session_id, action_id="nobody", outcome=ok),
        Resolved(session_id=session_id, action_id="nobody", state="finished", outcome=ok),
        Completed(request_id="nobody", session_id=session_id, content="late"),
        CommandAnswered(session_id=session_id, request_id="nobody"),
        WakeupMessage(1, payload="no such timer"),
        WakeupMessage(1, payload=Timer("restart", (("runtime",), "forged"))),
        Forged("child_gave_up"), Forged("timer_cooldown_over"), Forged("poison"),
    ]


class Tree:
    """One session's supervisor in a simple system, and the couriers around it."""

    def __init__(self, asys: ActorSystem, home: Home, workspace: Path,
                 policy: RestartPolicy | None = None,
                 session_class: type = FakeSession) -> None:
        self.asys, self.home = asys, home
        self.start = _start(home, workspace)
        self.sid = self.start.session_id
        self.policy = policy or RestartPolicy()
        self.parent, self.broker, self.client, self.stranger = (
            asys.createActor(Courier) for _ in range(4))
        self.session = asys.createActor(session_class)

    def tell(self, *msgs: Any, via: Any = None) -> None:
        """Deliver ``msgs`` from ``via`` (default: the stranger), all before any answer."""
        self.asys.tell(via or self.stranger, Deliver(self.session, msgs))

    def boot(self) -> None:
        self.tell(BootGroup(broker=self.broker, policy=self.policy),
                  WatchSession(start=self.start, reply_to=self.client), via=self.parent)

    def command(self, command: str, session_id: str | None = None) -> Any:
        cmd = UserCommand(request_id=uuid.uuid4().hex, session_id=session_id or self.sid,
                          command=command)
        self.tell(Relay(msg=cmd, reply_to=self.client), via=self.parent)
        # the answer goes up to the parent, which passes it to the client (the root does)
        answers = [m.answer if isinstance(m, CommandAnswered) else m
                   for to, m in Courier.seen if to in (self.client, self.parent)
                   and getattr(m, "request_id", None) == cmd.request_id]
        assert len(answers) <= 1, answers
        return answers[0] if answers else None

    def got(self, kind: type, at: Any = None) -> list[Any]:
        return [m for to, m in Courier.seen if isinstance(m, kind) and at in (None, to)]

    def view(self) -> SessionView:
        store = open_store(self.home)
        try:
            return SessionView.of(store.read(self.sid))
        finally:
            store.close()


def _runtime_boots() -> int:
    return len([m for m in FakeRuntime.seen if isinstance(m, BootRuntime)])


def _model_calls() -> int:
    return len([m for _, m in Courier.seen if isinstance(m, Complete)])


# ---- SessionSupervisor ---------------------------------------------------------------


def test_session_supervisor_before_its_boot_drops_all_and_starts_nothing(
    system, drops, tmp_path
):
    tree = Tree(system, Home.at(tmp_path / "home"), tmp_path)
    sid = tree.sid
    early = [
        RuntimeReady(session_id=sid, epoch=1, attached=False),
        RuntimeFailed(session_id=sid, epoch=1, cause="exited", detail="early"),
        StoreFault(session_id=sid, cause="disk full"),
        RestartRuntime(reason="early"), BrokerMoved(broker=tree.stranger),
        Superseded(session_id=sid, reason="early"),
        SandboxClosed(request_id="early", session_id=sid),
        Failing(role="runtime", reason="early"), ChildActorExited(tree.stranger),
        *_junk(sid),
    ]
    tree.tell(*early)
    # Thespian's own (a child's exit, a timer) are dropped at once; the rest is kept until
    # its boot (Thespian may deliver a parent's later messages first): none is acted on,
    # none answered yet
    at_once = [m for m in early if isinstance(m, (ChildActorExited, WakeupMessage))]
    _one_line_each(drops(), at_once)
    assert tree.command("pause") is None
    tree.tell(Shutdown(request_id="early"), via=tree.parent)
    assert drops() == [] and not tree.got(ShutdownDone)
    assert _runtime_boots() == 0 and not tree.got(Complete) and not tree.got(StoreFault)
    tree.boot()  # then each is handled in its order: dropped, or answered
    _one_line_each(drops(), [m for m in early if m not in at_once])
    assert [m.error for m in tree.got(Refused)] == ["UnknownSession"]  # the early pause
    assert [d.request_id for d in tree.got(ShutdownDone)] == ["early"]  # none to close
    assert [a.request_id for a in tree.got(Accepted)] == [tree.start.request_id]
    assert _runtime_boots() == 1 and len(tree.got(Complete, at=tree.broker)) == 1
    assert isinstance(tree.command("pause"), Accepted)


def test_session_supervisor_drops_strangers_duplicates_and_junk(system, drops, tmp_path):
    tree = Tree(system, Home.at(tmp_path / "home"), tmp_path)
    tree.boot()
    sid = tree.sid
    assert tree.view().state == AgentState.RUNNING and len(tree.got(Complete)) == 1
    assert drops() == []
    late = [
        BootGroup(broker=tree.stranger, policy=tree.policy),
        WatchSession(start=tree.start),  # not from its parent
        RuntimeReady(session_id=sid, epoch=9, attached=True),
        RuntimeFailed(session_id=sid, epoch=1, cause="exited", detail="a stale proxy"),
        RestartRuntime(reason="not from the controller"),
        BrokerMoved(broker=tree.stranger),
        StoreFault(session_id=sid, cause="not from the controller"),
        StoreFault(session_id="s-another", cause="disk full"),
        Superseded(session_id=sid, reason="not from a child"),
        SandboxClosed(request_id="nobody asked", session_id=sid),
        Working(session_id=sid, working=True), BrokerSlow(session_id=sid, waited_s=30),
        ProbeAnswer(token="never sent"), BootedUp(),
        Failing(role="controller", reason="not a child"), ChildActorExited(tree.stranger),
        Relay(msg=Completed(request_id="r", session_id=sid), reply_to=None),
        *_junk(sid),
    ]
    tree.tell(*late)
    again = [BootGroup(broker=tree.stranger, policy=tree.policy),  # a second boot, and
             WatchSession(start=tree.start)]  # a session it has: even from its parent
    tree.tell(*again, via=tree.parent)
    _one_line_each(drops(), [*late, *again])
    view = tree.view()
    assert view.state == AgentState.RUNNING and view.actions == 0
    assert _runtime_boots() == 1 and not [m for m in FakeRuntime.seen if isinstance(m, Execute)]
    assert len(tree.got(Complete)) == 1 and not tree.got(Complete, at=tree.stranger)
    assert not tree.got(StoreFault) and not tree.got(Superseded)
    refused = tree.command("pause", session_id="s-another")
    assert isinstance(refused, Refused) and refused.error == "UnknownSession"
    assert tree.view().state == AgentState.RUNNING
    assert isinstance(tree.command("pause"), Accepted)


def test_session_supervisor_answers_every_shutdown_once(system, drops, tmp_path):
    tree = Tree(system, Home.at(tmp_path / "home"), tmp_path)
    tree.boot()
    twice = [Shutdown(request_id="one"), Shutdown(request_id="two"), Shutdown(request_id="two")]
    tree.tell(*twice, via=tree.parent)
    done = tree.got(ShutdownDone, at=tree.parent)
    assert sorted(d.request_id for d in done) == ["one", "two", "two"]
    assert all(d.sessions == [tree.sid] for d in done)
    tree.tell(Shutdown(request_id="three"), via=tree.parent)  # after the close: still answered
    assert [d.request_id for d in tree.got(ShutdownDone)][-1] == "three"
    assert drops() == []


def test_a_cooldown_timer_after_the_runtime_came_back_starts_nothing(
    system, drops, tmp_path
):
    policy = RestartPolicy(intensity=0, giveup_cooldown_s=0.3, giveup_rounds=1)
    tree = Tree(system, Home.at(tmp_path / "home"), tmp_path, policy)
    tree.boot()
    system.tell(FakeRuntime.booted[-1], ActorExitRequest())  # the sandbox dies: given up
    assert tree.view().state == AgentState.ERROR and tree.view().resumes_at is not None
    assert isinstance(tree.command("resume"), Accepted)  # the user's restart beats the timer
    assert _runtime_boots() == 2 and tree.view().state == AgentState.RUNNING
    asked = len(tree.got(Complete))

    def timer_fired() -> bool:
        system.listen(0.05)  # lets the simple system deliver due timers
        return any("cooldown_over" in r.getMessage() for r in drops())

    wait_until(timer_fired, 10, "the stale cooldown timer to be dropped")
    assert _runtime_boots() == 2 and len(tree.got(Complete)) == asked
    assert tree.view().state == AgentState.RUNNING


def test_a_restarted_controller_is_not_told_a_given_up_runtime_is_ready(
    system, drops, tmp_path
):
    policy = RestartPolicy(intensity=1, backoff_initial_s=0.0, giveup_cooldown_s=60.0)
    tree = Tree(system, Home.at(tmp_path / "home"), tmp_path, policy)
    tree.boot()
    system.tell(FakeRuntime.booted[-1], ActorExitRequest())  # restarted at once
    assert _runtime_boots() == 2 and tree.view().state == AgentState.RUNNING
    system.tell(FakeRuntime.booted[-1], ActorExitRequest())  # past the intensity: given up
    view = tree.view()
    assert view.state == AgentState.ERROR and view.resumes_at is not None
    asked = len(tree.got(Complete))
    # the Controller dies once (within its own budget) and is rebuilt from the log
    system.tell(RecordedController.booted[-1], ActorExitRequest())
    assert len(RecordedController.booted) == 2
    view = tree.view()
    assert view.state == AgentState.ERROR, view.reason  # the sandbox is still down
    assert len(tree.got(Complete)) == asked and _runtime_boots() == 2
    assert isinstance(tree.command("pause"), Accepted)



def test_a_command_after_the_agent_loop_gave_up_for_good_is_answered(system, drops, tmp_path):
    policy = RestartPolicy(intensity=0, giveup_rounds=0)
    tree = Tree(system, Home.at(tmp_path / "home"), tmp_path, policy)
    tree.boot()
    system.tell(RecordedController.booted[-1], ActorExitRequest())  # down until a resume
    view = tree.view()
    assert view.state == AgentState.ERROR and view.resumes_at is None
    store = open_store(tree.home)
    try:
        last = [e for e in store.read(tree.sid) if isinstance(e, StateChanged)][-1]
    finally:
        store.close()
    assert last.cause == Why.LOOP_DOWN  # recorded by a stand-in Controller, the one writer
    assert tree.got(Superseded, at=tree.parent)  # the root is asked to stop this session
    refused = tree.command("resume")  # not held for ever: the program restores it anew
    assert isinstance(refused, Refused) and refused.error == "UnknownSession"
    assert len(RecordedController.booted) == 1 and _runtime_boots() == 1

class SlowStandIn(RecordedController):
    """A Controller whose stand-in incarnation records the downtime only when told to:
    the window in which a user's command can reach the supervisor first."""

    waiting: ClassVar[list[Any]] = []

    def receiveMessage(self, msg: Any, sender: Any) -> Any:  # noqa: N802
        if isinstance(msg, RecordDowntime):
            SlowStandIn.waiting.append(self.myAddress)
            self._held_downtime = (msg, sender)
            return None
        if msg == "record now":
            msg, sender = self._held_downtime
        return super().receiveMessage(msg, sender)


class SlowStandInSession(FakeSession):
    controller_class = SlowStandIn


def test_a_resume_while_the_downtime_is_recorded_carries_the_session_on(
    system, drops, tmp_path
):
    """The user saw ERROR in the log and resumed before the supervisor heard the stand-in
    had recorded it: the resume is held, then carries the session on (it once restarted
    the Controller beside the stand-in, and the session then stopped under the new one,
    leaving it RUNNING with no actor: stuck)."""
    SlowStandIn.waiting = []
    policy = RestartPolicy(intensity=0, giveup_rounds=0)
    tree = Tree(system, Home.at(tmp_path / "home"), tmp_path, policy, SlowStandInSession)
    tree.boot()
    first = RecordedController.booted[-1]
    system.tell(first, ActorExitRequest())  # down until a resume; the stand-in waits
    assert len(SlowStandIn.waiting) == 1
    assert tree.command("resume") is None  # held, not refused, not run beside the stand-in
    assert RecordedController.booted == [first]
    system.tell(SlowStandIn.waiting[0], "record now")
    assert not tree.got(Superseded, at=tree.parent)  # the session is not stopped
    assert len(RecordedController.booted) == 2  # then the resumed one (the stand-in is not booted)
    resumed = [m.answer for to, m in Courier.seen if to == tree.parent  # passed up
               and isinstance(m, CommandAnswered) and isinstance(m.answer, Accepted)]
    assert resumed, "the resume was never answered"
    view = tree.view()
    assert view.state == AgentState.RUNNING, view.reason
    events = [e for e in _events(tree) if isinstance(e, StateChanged)]
    assert [e.cause for e in events][-2:] == [Why.LOOP_DOWN, Why.USER_RESUME]


def _events(tree: Tree) -> list[Any]:
    store = open_store(tree.home)
    try:
        return list(store.read(tree.sid))
    finally:
        store.close()


# ---- RootSupervisor ------------------------------------------------------------------


class Root:
    """A root in a simple system, with a courier broker and fake sessions under it."""

    def __init__(self, asys: ActorSystem, home: Home, workspace: Path,
                 root_class: type = FakeRoot) -> None:
        self.asys, self.home, self.workspace = asys, home, workspace
        self.client, self.stranger = asys.createActor(Courier), asys.createActor(Courier)
        self.root = asys.createActor(root_class)

    def tell(self, *msgs: Any, via: Any = None) -> None:
        self.asys.tell(via or self.stranger, Deliver(self.root, msgs))

    def ask(self, msg: Any) -> Any:
        """Send ``msg`` from the client; its one answer (matched by request id) or None."""
        self.tell(msg, via=self.client)
        request_id = getattr(msg, "request_id", "boot")
        answers = [m for to, m in Courier.seen
                   if to == self.client and getattr(m, "request_id", None) == request_id]
        assert len(answers) <= 1, answers
        return answers[0] if answers else None

    def command(self, session_id: str, command: str = "pause") -> Any:
        return self.ask(UserCommand(request_id=uuid.uuid4().hex, session_id=session_id,
                                    command=command))

    def fault(self, session_id: str) -> str | None:
        status = self.ask(FaultQuery(request_id=uuid.uuid4().hex, session_id=session_id))
        assert isinstance(status, FaultStatus)
        return status.cause


def _split_boot(root: Root) -> BootRoot:
    return BootRoot(home=str(root.home.root), policy=RestartPolicy())


def _broker_boots() -> int:
    return len([m for _, m in Courier.seen if isinstance(m, BootBroker)])


def test_root_before_its_boot_answers_or_drops_and_starts_nothing(system, drops, tmp_path):
    root = Root(system, Home.at(tmp_path / "home"), tmp_path)
    start = _start(root.home, tmp_path)
    early = [
        ShutdownDone(request_id="nobody"), Superseded(session_id=start.session_id, reason="x"),
        StoreFault(session_id=start.session_id, cause="disk full"),
        Failing(role="broker", reason="not a child"), ChildActorExited(root.stranger),
        Relay(msg=UserCommand(request_id="r", session_id=start.session_id, command="stop"),
              reply_to=None),
        *_junk(start.session_id),
    ]
    root.tell(*early)
    _one_line_each(drops(), early)
    refused = root.ask(start)  # no broker yet: a session could never ask its model
    assert isinstance(refused, Refused) and refused.session_id == start.session_id
    assert _runtime_boots() == 0 and not RecordedController.booted
    assert isinstance(root.command(start.session_id), Refused)
    assert root.fault(start.session_id) is None
    assert isinstance(root.ask(Shutdown(request_id="early")), ShutdownDone)
    assert root.ask(_split_boot(root)) == Accepted(
        request_id="boot", session_id="")
    assert _broker_boots() == 1
    again = start.model_copy(update={"request_id": "after-boot"})
    assert isinstance(root.ask(again), Accepted) and _runtime_boots() == 1
    assert drops() == []


def test_root_drops_strangers_duplicates_and_junk(system, drops, tmp_path):
    root = Root(system, Home.at(tmp_path / "home"), tmp_path)
    assert isinstance(root.ask(_split_boot(root)),
                      Accepted)
    start = _start(root.home, tmp_path)
    sid = start.session_id
    assert isinstance(root.ask(start), Accepted)
    assert isinstance(root.ask(start.model_copy(update={"request_id": "again"})), Accepted)
    assert _runtime_boots() == 1 and _model_calls() == 1
    late = [
        BootRoot(home=str(tmp_path / "elsewhere"), policy=RestartPolicy(intensity=0)),
        StoreFault(session_id=sid, cause="not from its session"),
        StoreFault(session_id="s-another", cause="disk full"),
        Superseded(session_id=sid, reason="not from its session"),
        ShutdownDone(request_id="nobody asked"),
        Working(session_id=sid, working=True), BrokerSlow(session_id=sid, waited_s=30),
        ProbeAnswer(token="never sent"), BootedUp(),
        Failing(role="broker", reason="not a child"), ChildActorExited(root.stranger),
        *_junk(sid),
    ]
    root.tell(*late)
    _one_line_each(drops(), late)
    assert _broker_boots() == 1 and _runtime_boots() == 1
    assert _model_calls() == 1
    assert root.fault(sid) is None and root.fault("s-another") is None
    unknown = root.command("s-another")
    assert isinstance(unknown, Refused) and unknown.error == "UnknownSession"
    assert isinstance(root.command(sid), Accepted)  # still live: not stopped by a stranger
    assert drops() == []


def test_root_answers_every_shutdown_once(system, drops, tmp_path):
    root = Root(system, Home.at(tmp_path / "home"), tmp_path)
    root.ask(_split_boot(root))
    start = _start(root.home, tmp_path)
    assert isinstance(root.ask(start), Accepted)
    root.tell(Shutdown(request_id="one"), Shutdown(request_id="two"),
              Shutdown(request_id="two"), via=root.client)
    done = [m for to, m in Courier.seen if to == root.client and isinstance(m, ShutdownDone)]
    assert sorted(d.request_id for d in done) == ["one", "two", "two"]
    assert all(d.sessions == [start.session_id] for d in done)
    assert drops() == []


class SilentController(Controller):
    """A Controller that never comes up: its boot does nothing."""

    def on_boot_controller(self, msg: BootController, sender: Any) -> None:
        RecordedController.booted.append(self.myAddress)


class SilentSession(FakeSession):
    controller_class = SilentController


class SilentRoot(FakeRoot):
    session_class = SilentSession


def test_a_session_is_accepted_before_its_controller_is_up(system, tmp_path):
    """start_session does not wait three forks and a boot: the root answers once the
    session's supervisor is under supervision, whatever its Controller then does."""
    root = Root(system, Home.at(tmp_path / "home"), tmp_path, root_class=SilentRoot)
    assert isinstance(root.ask(_split_boot(root)),
                      Accepted)
    start = _start(root.home, tmp_path)
    answer = root.ask(start)
    assert answer == Accepted(request_id=start.request_id, session_id=start.session_id)
    assert len(RecordedController.booted) == 1  # booted, and never up


# ---- RootSupervisor: a session whose supervisor is down ------------------------------


class DeadSession(FakeSession):
    """A session supervisor that dies at its boot: the root gives up on it."""

    boots: ClassVar[int] = 0

    def on_boot_group(self, msg: BootGroup, sender: Any) -> None:
        DeadSession.boots += 1
        if DeadSession.boots <= DeadSession.dying:
            self.send(self.myAddress, ActorExitRequest())
            return
        super().on_boot_group(msg, sender)

    dying: ClassVar[int] = 0


class DeadRoot(FakeRoot):
    session_class = DeadSession


class Closer(FakeRuntime):
    """A one-shot proxy whose ``CloseFor`` answers at once (the sandbox is not tested)."""

    closed: ClassVar[list[str]] = []

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802
        if isinstance(msg, CloseFor):
            Closer.closed.append(msg.start.session_id)
            self.send(sender, SandboxClosed(request_id=msg.request_id,
                                            session_id=msg.start.session_id))
            self.send(self.myAddress, ActorExitRequest())
        else:
            super().receiveMessage(msg, sender)


class ClosingSession(DeadSession):
    runtime_class = Closer


class ClosingRoot(FakeRoot):
    session_class = ClosingSession


def _down(system: ActorSystem, tmp_path: Path, policy: RestartPolicy, dying: int,
          root_class: type = DeadRoot) -> tuple[Root, StartSession]:
    """A root whose session's supervisor dies at its first ``dying`` boots."""
    DeadSession.boots, DeadSession.dying, Closer.closed = 0, dying, []
    root = Root(system, Home.at(tmp_path / "home"), tmp_path, root_class=root_class)
    assert isinstance(root.ask(BootRoot(home=str(root.home.root), policy=policy)), Accepted)
    start = _start(root.home, tmp_path)
    assert isinstance(root.ask(start), Accepted)
    return root, start


def test_a_session_whose_supervisor_cannot_start_is_a_fault_until_it_does(
        system, drops, tmp_path):
    """No supervisor, so no Controller to write the log: the root says why to the
    session's clients, and a command wakes the session at once in its cooldown."""
    policy = RestartPolicy(intensity=0, giveup_rounds=1, giveup_cooldown_s=600)
    root, start = _down(system, tmp_path, policy, dying=1)
    fault = root.fault(start.session_id)
    assert fault is not None and "the session's supervisor failed 1 time" in fault, fault
    assert not RecordedController.booted
    answer = root.command(start.session_id, "pause")  # held, then handed to the new one
    assert isinstance(answer, Accepted), answer
    assert len(RecordedController.booted) == 1 and root.fault(start.session_id) is None


def test_a_session_whose_supervisor_is_down_still_has_its_sandbox_closed(
        system, drops, tmp_path):
    """Nobody runs the session in its cooldown; at close a one-shot proxy stops its
    sandbox, and two shutdowns under way at once are both answered by it."""
    policy = RestartPolicy(intensity=0, giveup_rounds=1, giveup_cooldown_s=600)
    root, start = _down(system, tmp_path, policy, dying=1, root_class=ClosingRoot)
    root.tell(Shutdown(request_id="close", stop_sandboxes=True),
              Shutdown(request_id="again", stop_sandboxes=True), via=root.client)
    done = [m for to, m in Courier.seen if to == root.client and isinstance(m, ShutdownDone)]
    assert sorted((d.request_id, tuple(d.sessions)) for d in done) == [
        ("again", (start.session_id,)), ("close", (start.session_id,))]
    assert Closer.closed == [start.session_id]
    left = root.ask(Shutdown(request_id="leave", stop_sandboxes=False))  # nothing to stop
    assert isinstance(left, ShutdownDone) and Closer.closed == [start.session_id]


def test_a_supervisor_down_at_shutdown_is_not_started_again_after_its_sandbox_closed(
        system, drops, tmp_path):
    """The tree closes while a session's supervisor waits out its cooldown: a closer
    stops the sandbox, and the cooldown's end must not start the session again (it would
    bring the sandbox back up after its close)."""
    policy = RestartPolicy(intensity=0, giveup_rounds=1, giveup_cooldown_s=0.3)
    root, start = _down(system, tmp_path, policy, dying=1, root_class=ClosingRoot)
    done = root.ask(Shutdown(request_id="close", stop_sandboxes=True))
    assert isinstance(done, ShutdownDone) and done.sessions == [start.session_id]
    assert Closer.closed == [start.session_id]

    def cooldown_over() -> bool:
        system.listen(0.05)  # lets the simple system deliver due timers
        return any("cooldown_over" in r.getMessage() for r in drops())

    wait_until(cooldown_over, 10, "the cooldown's end to be dropped")
    assert DeadSession.boots == 1 and not RecordedController.booted  # never started again


# ---- a settled session stands down (the supervisors' side; the Controller's own words
# are in test_stand_down.py, with real processes) ----------------------------------------


class StandingController(RecordedController):
    """A real Controller that asks to stand down, and says it has, when the test says."""

    answers: ClassVar[list[StandDown]] = []

    def receiveMessage(self, msg: Any, sender: Any) -> Any:  # noqa: N802
        if isinstance(msg, tuple) and msg[0] == "ask":
            self.send(self._parent_address, StandingDown(session_id=msg[1], relays=msg[2]))
        elif isinstance(msg, tuple) and msg[0] == "stepped":
            self.send(self._parent_address, SteppedDown(session_id=msg[1], stayed=msg[2]))
        elif isinstance(msg, StandDown):
            StandingController.answers.append(msg)
        else:
            return super().receiveMessage(msg, sender)
        return None


class StandingSession(FakeSession):
    controller_class = StandingController


class StandingRoot(FakeRoot):
    session_class = StandingSession


def _root(system: Any, tmp_path: Any) -> tuple[Root, str]:
    StandingController.answers = []
    root = Root(system, Home.at(tmp_path / "home"), tmp_path, root_class=StandingRoot)
    boot = BootRoot(home=str(root.home.root), policy=RestartPolicy(backoff_initial_s=0))
    assert isinstance(root.ask(boot), Accepted)
    start = _start(root.home, tmp_path)
    assert isinstance(root.ask(start), Accepted)
    assert len(RecordedController.booted) == 1
    return root, start.session_id


def _answered(root: Root, request_id: str) -> list[Any]:
    return [m for to, m in Courier.seen
            if to == root.client and getattr(m, "request_id", None) == request_id]


def _held(root: Root, session_id: str) -> str:
    """Send a pause that the root holds (no answer yet); its request id."""
    cmd = UserCommand(request_id="held-pause", session_id=session_id, command="pause")
    assert root.ask(cmd) is None
    return cmd.request_id


def test_a_session_with_a_command_on_its_way_is_told_to_stay(system, drops, tmp_path):
    root, sid = _root(system, tmp_path)
    controller = RecordedController.booted[-1]
    assert isinstance(root.command(sid), Accepted)  # one relay handed to the Controller
    system.tell(controller, ("ask", sid, 0))  # it counts none: the relay is on its way
    assert [a.go for a in StandingController.answers] == [False]
    system.tell(controller, ("ask", sid, 1))
    assert [a.go for a in StandingController.answers] == [False, True]
    assert drops() == []


def test_stood_down_the_session_is_forgotten_and_a_command_restores_it(
        system, drops, tmp_path):
    root, sid = _root(system, tmp_path)
    controller = RecordedController.booted[-1]
    system.tell(controller, ("ask", sid, 0))
    system.tell(controller, ("stepped", sid, False))
    closes = [m for m in FakeRuntime.seen if isinstance(m, CloseSandbox)]
    assert len(closes) == 1  # the sandbox was closed first
    assert len(RecordedController.booted) == 1  # nothing started again
    refused = root.command(sid)  # the program restores it on this (Trouper.command)
    assert isinstance(refused, Refused) and refused.error == "UnknownSession"
    assert drops() == []


@pytest.mark.parametrize("stayed", [False, True], ids=["stood-down", "stayed"])
def test_a_command_while_it_stands_down_is_carried_out(system, drops, tmp_path, stayed):
    """Held by the root, then handed to the session that stayed, or to its successor,
    started at once."""
    root, sid = _root(system, tmp_path)
    controller = RecordedController.booted[-1]
    system.tell(controller, ("ask", sid, 0))
    request_id = _held(root, sid)
    system.tell(controller, ("stepped", sid, stayed))
    assert len(RecordedController.booted) == (1 if stayed else 2)
    assert [type(a) for a in _answered(root, request_id)] == [Accepted]
    assert isinstance(root.command(sid, "resume"), Accepted)  # no longer held
    assert drops() == []


def test_a_controller_killed_while_it_stands_down_loses_no_command(system, drops, tmp_path):
    """The Controller dies after the root said go, before it said it was still idle: it
    is restarted as any dead Controller is, takes the command held meanwhile, and may
    stand down again later (the root forgot the first attempt)."""
    root, sid = _root(system, tmp_path)
    first = RecordedController.booted[-1]
    system.tell(first, ("ask", sid, 0))
    request_id = _held(root, sid)
    system.tell(first, ActorExitRequest())  # as a SIGKILL would, to its supervisor
    assert len(RecordedController.booted) == 2
    assert [type(a) for a in _answered(root, request_id)] == [Accepted]
    second = RecordedController.booted[-1]
    system.tell(second, ("ask", sid, 1))  # it had the held command: one relay
    assert [a.go for a in StandingController.answers] == [True, True]


def test_stand_down_words_from_anyone_but_the_live_children_are_dropped(
        system, drops, tmp_path):
    root, sid = _root(system, tmp_path)
    forged = [StandingDown(session_id=sid, relays=0), SteppedDown(session_id=sid),
              StandingDown(session_id="s-another", relays=0)]
    root.tell(*forged)
    _one_line_each(drops(), forged)
    controller = RecordedController.booted[-1]
    system.tell(controller, ("stepped", sid, False))  # it never asked: not standing down
    assert len(drops()) == 1
    assert StandingController.answers == []
    assert isinstance(root.command(sid), Accepted)  # still its own
