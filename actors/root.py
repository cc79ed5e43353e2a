"""RootSupervisor: the top of the actor tree. Owns the shared LLMBroker and the
SessionSupervisors, each watching a group of sessions (``root_sessions.py``); user
requests enter the tree here.

    RootSupervisor
    ├── LLMBroker                (shared: rate limits belong to a key, not a session)
    ├── SessionSupervisor[group 1]
    │   ├── RuntimeProxy[s1], Controller[s1]
    │   └── RuntimeProxy[s2], Controller[s2] ...
    └── SessionSupervisor[group 2] ...

It is created from outside the actor system, so nobody restarts it: if it dies, its
subtree dies with it (every actor dies with its parent) and the program must reopen its
``Trouper``, which restores the sessions from the log. When the program that embeds the
system dies, Thespian's admin takes the whole system down (``actors/forking.py``).

Nobody restarts it, so every handler is total (I6, docs/promises.md): a request it cannot serve is
refused, and a report not from the child it names (a session's StoreFault or Superseded,
a ShutdownDone) is dropped with a log line, never acted on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from thespian.actors import ActorAddress

from ..config.settings import settings
from ..home.paths import Home
from ..messages.protocol import (
    Accepted,
    FaultQuery,
    FaultStatus,
    Refusal,
    Refused,
    SandboxClosed,
    StartSession,
    StoreFault,
    UserCommand,
)
from ..messages.tree import (
    BootBroker,
    BootRoot,
    BrokerMoved,
    BrokerSlow,
    CloseFor,
    DowntimeUnrecorded,
    Relay,
    Shutdown,
    ShutdownDone,
    Superseded,
    Working,
)
from ..observability import metrics
from ..supervisor import ChildSpec, give_up_text
from .base import Timer
from .lazy_broker import LazyBroker
from .root_sessions import BROKER, RootSessions

logger = logging.getLogger(__name__)

@dataclass
class _Closing:
    """One shutdown under way: who asked, which sessions it waits for, which are done."""

    reply_to: list[ActorAddress]
    waiting: set[str]
    held: list[str]
    """The sessions the tree ran when the shutdown came."""
    done: list[str] = field(default_factory=list)


class RootSupervisor(RootSessions):
    role = "root"
    broker_class: type = LazyBroker
    """The shared LLM broker (``LazyBroker``: the root never imports litellm); a test puts
    a fake in its place."""

    def __init__(self) -> None:
        super().__init__()
        self.home = ""
        self.pending_shutdown: dict[str, _Closing] = {}
        self.closing = False
        """A shutdown came: the tree is going away, and no session is started again (its
        sandbox may be closed already)."""
        self.faults: dict[str, StoreFault] = {}
        """Sessions that cannot record anything now, for clients (the log cannot say)."""
        self.unrecorded: set[str] = set()
        """Those of ``faults`` that are a downtime no process could record."""
        self.closers: dict[str, ActorAddress] = {}
        """Session -> the one-shot proxy closing its sandbox while the tree closes."""
        self.working: set[str] = set()
        """Sessions whose Controller said they work (their supervisor is probed)."""

    def on_boot_root(self, msg: BootRoot, sender: ActorAddress) -> None:
        self.home, self.policy = msg.home, msg.policy
        self.publish_pid(Home.at(msg.home).actor_pid_path("root"))
        if self.child(BROKER) is None:
            self.supervise(ChildSpec(BROKER, self.broker_class,
                                     lambda n: BootBroker(home=msg.home)))
        self.send(sender, Accepted(request_id="boot", session_id=""))

    # -- requests --------------------------------------------------------------

    def on_start_session(self, msg: StartSession, sender: ActorAddress) -> None:
        if not self.booted:  # no broker yet: the session could never ask its model
            self.send(sender, Refused(request_id=msg.request_id, session_id=msg.session_id,
                                      error=Refusal.INVALID_REQUEST,
                                      message="the actor tree is not booted yet"))
            return
        self._start_session(msg, sender)

    def on_user_command(self, msg: UserCommand, sender: ActorAddress) -> None:
        self.forward(Relay(msg=msg, reply_to=sender))

    def _start_session(self, start: StartSession, reply_to: ActorAddress | None) -> None:
        kept = self.kept.get(start.session_id)
        if kept is not None:
            if kept.standing_down:
                kept.restore_asked = True  # started again once it is gone
            if reply_to is not None:  # running (or restarting) already
                self.send(reply_to, Accepted(request_id=start.request_id,
                                             session_id=start.session_id))
            return
        # answered first, not once the session's processes are up: the session is in the
        # store, and its start below cannot be refused (a fork that fails is the child's
        # exit, restarted under the policy: ``reaping.start_failure`` names the cause); a
        # caller starting many goes on with the next while this one forks, and what goes
        # wrong later is in the session's log, or its fault while no process can write it
        if reply_to is not None:
            self.send(reply_to, Accepted(request_id=start.request_id,
                                         session_id=start.session_id))
        self._recorded_again(start.session_id)
        self.start_kept(start)

    def on_superseded(self, msg: Superseded, sender: ActorAddress) -> None:
        """Its supervisor let the session's children go (another Trouper owns its log, or
        the session is down for good): the next command restores it."""
        if self.from_session(msg.session_id, sender, msg) is None:
            return
        self.faults.pop(msg.session_id, None)
        self.forget(msg.session_id)
        self._work_of(msg.session_id, False)

    def on_store_fault(self, msg: StoreFault, sender: ActorAddress) -> None:
        if self.from_session(msg.session_id, sender, msg) is None:
            return  # else a stopped session's late word would stay a fault for ever
        if msg.cause is None:
            self.faults.pop(msg.session_id, None)
        else:
            self.faults[msg.session_id] = msg

    def on_working(self, msg: Working, sender: ActorAddress) -> None:
        kept = self.from_session(msg.session_id, sender, msg)
        if kept is not None:
            self._recorded_again(msg.session_id)  # its Controller is up: the log speaks
            self._work_of(msg.session_id, msg.working, kept.group)

    def on_downtime_unrecorded(self, msg: DowntimeUnrecorded, sender: ActorAddress) -> None:
        if self.from_session(msg.session_id, sender, msg) is not None:
            self.downtime_unrecorded(msg.session_id, msg.reason)

    def _work_of(self, session_id: str, working: bool, group: str | None = None) -> None:
        """A supervisor is probed while any session of its group works."""
        if working:
            self.working.add(session_id)
        else:
            self.working.discard(session_id)
        if group is not None:
            self.mark_working(group, any(s in self.working for s in self.groups.get(group, ())))

    def on_broker_slow(self, msg: BrokerSlow, sender: ActorAddress) -> None:
        if self.from_session(msg.session_id, sender, msg) is not None:
            self.probe(BROKER, f"session {msg.session_id}'s model call waited "
                               f"{msg.waited_s:g} s for it")

    def on_fault_query(self, msg: FaultQuery, sender: ActorAddress) -> None:
        fault = self.faults.get(msg.session_id)
        self.send(sender, FaultStatus(
            request_id=msg.request_id, session_id=msg.session_id,
            cause=fault.cause if fault else None, since=fault.since if fault else None))

    # -- supervision hooks ---------------------------------------------------------

    def downtime_unrecorded(self, session_id: str, text: str) -> None:
        self.faults[session_id] = StoreFault(session_id=session_id, cause=text,
                                             since=datetime.now(UTC))
        self.unrecorded.add(session_id)

    def _recorded_again(self, session_id: str) -> None:
        """The session starts again: its log speaks for it (a store fault its Controller
        reported stays until the Controller says it is over)."""
        if session_id in self.unrecorded:
            self.unrecorded.discard(session_id)
            self.faults.pop(session_id, None)

    def on_child_restarted(
        self, role: str, address: ActorAddress, incarnation: int, reason: str
    ) -> None:
        metrics.restarted(role, reason)
        for kept in self.kept_in(role):
            self._recorded_again(kept.start.session_id)
        self.group_restarted(role, address)
        if role != BROKER:
            return
        for other in list(self._children):
            session = self.child(other)
            if other != BROKER and session is not None:
                self.send(session, BrokerMoved(broker=address))

    def on_child_down(self, role: str, reason: str) -> None:
        self.refuse_spent(role, reason)

    def on_child_gave_up(self, role: str, reason: str, retry_in_s: float | None) -> None:
        for kept in self.kept_in(role):
            self.refuse_all(kept, reason)
            # no supervisor, so no Controller to write the log: the root tells the
            # session's clients instead, until it starts again
            text, _ = give_up_text("the session's supervisor", self.policy, reason,
                                   retry_in_s)
            self.downtime_unrecorded(kept.start.session_id, text)
        later = f"trying again in {retry_in_s:g} s" if retry_in_s else "down until restarted"
        logger.error("root: %s gave up (%s): %s", role, later, reason)

    # -- shutdown ------------------------------------------------------------------

    def may_restart(self, role: str) -> bool:
        return not (self.closing and role != BROKER)

    def on_shutdown(self, msg: Shutdown, sender: ActorAddress) -> None:
        self.closing = True
        under_way = self.pending_shutdown.get(msg.request_id)
        if under_way is not None:  # the same request again: answered with the first
            under_way.reply_to.append(sender)
            return
        sessions = {r for r in self._children if r != BROKER and self.child(r) is not None}
        held = sorted(self.kept)
        # a session whose supervisor is down has nobody to stop its sandbox: a closer does
        closers = self._start_closers(msg) if msg.stop_sandboxes else set()
        if not sessions and not closers:
            self.send(sender, ShutdownDone(request_id=msg.request_id, held=held))
            return
        self.pending_shutdown[msg.request_id] = _Closing([sender], sessions | closers, held)
        for role in sessions:
            self.send(self.child(role), msg)
        self.after(settings().shutdown_deadline_s, "shutdown_deadline", msg.request_id)

    def _start_closers(self, shutdown: Shutdown) -> set[str]:
        """A one-shot RuntimeProxy for each session whose supervisor is down (restarting,
        in a cooldown), to stop its sandbox; the roles a shutdown waits for to be closed."""
        for kept in self.kept.values():
            role = kept.start.session_id
            if self.child(kept.group) is None and role not in self.closers:
                self.closers[role] = self.start_helper(
                    self.session_class.runtime_class,
                    CloseFor(start=kept.start, request_id=shutdown.request_id))
        return set(self.closers)

    def on_shutdown_done(self, msg: ShutdownDone, sender: ActorAddress) -> None:
        closing = self.pending_shutdown.get(msg.request_id)
        roles = [r for r in closing.waiting if sender is not None and sender == self.child(r)
                 ] if closing else []
        if closing is None or not roles:
            self.drop(msg, "no shutdown under way waits for it from there")
            return
        self._closed(msg.request_id, closing, roles, msg.sessions)

    def on_sandbox_closed(self, msg: SandboxClosed, sender: ActorAddress) -> None:
        """A closer stopped the sandbox of a session whose supervisor was down."""
        self._closer_done(sender, [msg.session_id] if msg.session_id else [])

    def on_helper_exited(self, address: ActorAddress) -> None:
        self._closer_done(address, [])  # one that died before it answered is answered for

    def _closer_done(self, closer: ActorAddress, sessions: list[str]) -> None:
        closed_by = [r for r, c in self.closers.items() if closer is not None and closer == c]
        if not closed_by:
            self.drop(closer, "not a closer of this tree's")
            return
        for role in closed_by:
            del self.closers[role]
        # every shutdown under way waits for its close alike
        for request_id, other in list(self.pending_shutdown.items()):
            waited = [r for r in closed_by if r in other.waiting]
            if waited:
                self._closed(request_id, other, waited, sessions)

    def _closed(self, request_id: str, closing: _Closing, roles: list[str],
                sessions: list[str]) -> None:
        closing.waiting.difference_update(roles)
        closing.done.extend(sessions)
        if not closing.waiting:
            self._shutdown_over(request_id)

    def on_timer_shutdown_deadline(self, request_id: str) -> None:
        if request_id not in self.pending_shutdown:
            self.drop(Timer("shutdown_deadline", request_id), "that shutdown is over")
            return
        self._shutdown_over(request_id)

    def _shutdown_over(self, request_id: str) -> None:
        closing = self.pending_shutdown.pop(request_id)
        for reply_to in closing.reply_to:
            self.send(reply_to, ShutdownDone(request_id=request_id, sessions=closing.done,
                                             held=closing.held))
