"""SessionSupervisor: supervises the RuntimeProxy and the Controller of each session of
its group (``sessions_per_supervisor`` at most; the root hands them out).

Each session's two children are actors of their own, in processes of their own, restarted
one for one under the session's policy (roles ``runtime:<id>`` and ``controller:<id>``):
a RuntimeProxy's crash never takes its Controller with it, and the supervisor tells the
Controller when the runtime went down and came back (so it resolves what was in flight
from the journal). It relays user commands to the Controller, holding them while it
restarts. Why a group and not one supervisor a session: ``docs/architecture.md``, "Why a
session is two processes under a shared supervisor".

It heeds only what comes from where it should (I5/I6, docs/promises.md): lifecycle
reports from a session's current proxy, requests for the sandbox or the store from its
current Controller, sessions and the broker's move from its parent, commands for
sessions it watches. Anything else (a replaced incarnation's late report, a second boot,
junk) is dropped with a log line.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from thespian.actors import ActorAddress

from ..home.paths import Home
from ..messages.protocol import (
    Refusal,
    Refused,
    RuntimeFailed,
    RuntimeFailure,
    RuntimeProgress,
    RuntimeReady,
    StoreFault,
    UserCommand,
)
from ..messages.tree import (
    BootController,
    BootGroup,
    BootRuntime,
    BrokerMoved,
    BrokerSlow,
    CommandAnswered,
    DowntimeRecorded,
    DowntimeUnrecorded,
    RecordDowntime,
    Relay,
    RestartRuntime,
    Rewire,
    RuntimeGaveUp,
    Superseded,
    WatchSession,
    Working,
)
from ..observability import metrics
from ..supervisor import ChildSpec, give_up_text
from . import reaping
from .controller import Controller
from .in_flight import CommandsInFlight, taken_text
from .runtime_proxy import RuntimeProxy
from .sandbox_closing import SandboxClosing
from .watched import CONTROLLER, RUNTIME, Watched, split_role

logger = logging.getLogger(__name__)


class SessionSupervisor(SandboxClosing):
    role = "session"
    runtime_class: type = RuntimeProxy
    """The actor that owns a sandbox; a test puts a fake in its place."""
    controller_class: type = Controller

    def __init__(self) -> None:
        super().__init__()
        self.sessions: dict[str, Watched] = {}
        self.broker: ActorAddress | None = None
        self.early: list[tuple[Any, ActorAddress]] = []
        """What came before the boot: handled after it, in order."""

    MAX_EARLY = 256
    """Messages kept before the boot at most; later ones are dropped (a flood, not a race)."""

    def _dispatch_own(self, msg: Any, sender: ActorAddress) -> None:
        # Thespian may deliver a parent's later messages to a new child before its boot
        # (a WatchSession dropped there left its session LOADING for good): kept until then
        if not self.booted and not self._stopping and not isinstance(msg, BootGroup):
            if len(self.early) < self.MAX_EARLY:
                self.early.append((msg, sender))
            else:
                self.drop(msg, "it came before the boot, past the ones kept", logging.WARNING)
            return
        super()._dispatch_own(msg, sender)

    def on_boot_group(self, msg: BootGroup, sender: ActorAddress) -> None:
        self.set_parent(sender)
        self.policy, self.broker = msg.policy, msg.broker
        early, self.early = self.early, []
        for held, held_sender in early:  # in their order, now that the parent is known
            self._dispatch_own(held, held_sender)

    def on_watch_session(self, msg: WatchSession, sender: ActorAddress) -> None:
        if not self.from_parent(msg, sender, "who hands it sessions"):
            return
        start = msg.start
        if start.session_id in self.sessions:
            self.drop(msg, "it watches that session already", logging.WARNING)
            return
        if self.shut:
            self.drop(msg, "the tree is closing: nothing starts", logging.WARNING)
            return
        watched = Watched(start, first_reply=msg.reply_to)
        self.sessions[start.session_id] = watched
        self.publish_pid(Home.at(start.home).actor_pid_path("session", start.session_id))
        self.supervise(ChildSpec(watched.runtime, self.runtime_class,
                                 lambda n: BootRuntime(start=start)))

        def boot_controller(n: int) -> BootController:
            reply_to = watched.first_reply if n == 1 else None
            again = start if n == 1 else start.model_copy(update={"restore": True})
            return BootController(start=again, broker=self.broker,
                                  runtime=self.child(watched.runtime), reply_to=reply_to)

        self.supervise(ChildSpec(watched.controller, self.controller_class, boot_controller))
        logger.debug("session %s: watched (%d in this supervisor)", start.session_id,
                     len(self.sessions))  # (not info: a log record is a frame to the logger)

    # -- runtime lifecycle ------------------------------------------------------------

    def on_runtime_ready(self, msg: RuntimeReady, sender: ActorAddress) -> None:
        watched = self.child_session(sender, RUNTIME, msg)
        if watched is not None:
            watched.ready, watched.misconfigured = msg, None
            self.to_controller(watched, msg)

    def on_runtime_progress(self, msg: RuntimeProgress, sender: ActorAddress) -> None:
        watched = self.child_session(sender, RUNTIME, msg)
        if watched is not None:
            self.to_controller(watched, msg)  # the Controller records it: the log's one writer

    def on_runtime_failed(self, msg: RuntimeFailed, sender: ActorAddress) -> None:
        # from a dead proxy, after its successor said ready, it would leave the Controller
        # in ERROR waiting for a RuntimeReady that already came
        watched = self.child_session(sender, RUNTIME, msg)
        if watched is not None:
            watched.ready = None
            if msg.cause == RuntimeFailure.MISCONFIGURED:  # the proxy lives on, idle
                watched.misconfigured = msg
            self.to_controller(watched, msg)

    def on_child_down(self, role: str, reason: str) -> None:
        kind, session_id = split_role(role)
        watched = self.sessions.get(session_id)
        if watched is None:
            return
        if kind == RUNTIME:
            self.runtime_lost(watched)
            # a proxy that reported its failure first already told the Controller; one
            # killed outright (or before it was ready) did not
            if watched.ready is not None:
                watched.ready = None
                self.to_controller(watched, RuntimeFailed(
                    session_id=session_id, epoch=0, cause=RuntimeFailure.EXITED,
                    detail=reason))
        else:  # what it may not be handed again is refused now
            self.stay(watched)
            for relay in watched.in_flight.spent():
                self._refuse(relay, Refusal.INVALID_REQUEST, taken_text(reason))

    def on_child_restarted(
        self, role: str, address: ActorAddress, incarnation: int, reason: str
    ) -> None:
        metrics.restarted(role, reason)
        kind, session_id = split_role(role)
        watched = self.sessions.get(session_id)
        if watched is None:
            return
        if kind == RUNTIME:
            watched.misconfigured = None  # a new proxy tries the sandbox again
            self.to_controller(watched, Rewire(runtime=address, reason=reason))
            return
        watched.handed = 0  # a new Controller counts afresh
        if watched.ready is not None:
            self.send(address, watched.ready)
        elif watched.misconfigured is not None:  # else it would wait for a start that failed
            self.send(address, watched.misconfigured)
        self._release_held(watched)

    def on_child_gave_up(self, role: str, reason: str, retry_in_s: float | None) -> None:
        kind, session_id = split_role(role)
        watched = self.sessions.get(session_id)
        if watched is None:
            return
        what = "the sandbox" if kind == RUNTIME else "the agent loop"
        text, resumes_at = give_up_text(what, self.policy, reason, retry_in_s)
        if kind == RUNTIME:
            self.runtime_lost(watched)
            watched.ready = None  # else a restarted Controller would be told it is ready
            self.to_controller(watched, RuntimeGaveUp(reason=text, resumes_at=resumes_at))
            return
        self.stay(watched)
        for relay in watched.in_flight.take_all():  # no Controller takes them now
            self._refuse(relay, Refusal.INVALID_REQUEST, taken_text(reason))
        self._controller_gave_up(watched, text, resumes_at)

    def _controller_gave_up(self, watched: Watched, text: str,
                            resumes_at: datetime | None) -> None:
        """Nobody drives the session now. The Controller is the log's only writer, so a
        stand-in incarnation records ERROR; who waits is answered once it is recorded."""
        logger.error("session %s: %s", watched.session_id, text)
        watched.recording = RecordDowntime(start=watched.start, reason=text,
                                           resumes_at=resumes_at)
        watched.stand_in = self.start_helper(self.controller_class, watched.recording)

    def on_downtime_recorded(self, msg: DowntimeRecorded, sender: ActorAddress) -> None:
        watched = self.sessions.get(msg.session_id)
        if watched is None or watched.recording is None or sender is None \
                or sender != watched.stand_in:
            self.drop(msg, "no downtime of that session is being recorded by its sender")
            return
        if msg.error:
            logger.error("session %s: the downtime is not in the log: %s",
                         watched.session_id, msg.error)
        self._downtime_settled(watched)

    def on_helper_exited(self, address: ActorAddress) -> None:
        if self.closer_exited(address):
            return
        for watched in list(self.sessions.values()):
            if watched.recording is not None and address == watched.stand_in:
                failed = reaping.start_failure(address)
                logger.error("session %s: the stand-in Controller exited before it "
                             "recorded the downtime%s", watched.session_id,
                             f" (its process could not be started: {failed})" if failed
                             else "")
                self.send(self._parent_address, DowntimeUnrecorded(
                    session_id=watched.session_id, reason=watched.recording.reason))
                self._downtime_settled(watched)
                return

    def _downtime_settled(self, watched: Watched) -> None:
        """Answer who waits for the loop, and (down for good) let the session go."""
        assert watched.recording is not None
        text, resumes_at = watched.recording.reason, watched.recording.resumes_at
        watched.recording, watched.stand_in = None, None
        waiting = [(watched.first_reply, watched.start.request_id)]
        waiting += [(h.reply_to, getattr(h.msg, "request_id", "")) for h in watched.held]
        watched.held, watched.first_reply = [], None
        for reply_to, request_id in waiting:
            if reply_to is not None:
                self.send(reply_to, Refused(request_id=request_id,
                                            session_id=watched.session_id,
                                            error=Refusal.INVALID_REQUEST, message=text))
        if watched.woken:  # answered by the Controller they start, as a resume in a cooldown
            watched.held, watched.woken = watched.woken, []
            command = watched.held[0].msg.command  # type: ignore[attr-defined]
            self.restart_child(watched.controller,
                               f"the user's {command} once the downtime was recorded")
            return
        if resumes_at is None:  # the program restores it on its next command
            logger.warning("session %s: %s; its actors stop", watched.session_id, text)
            self.forget_session(watched)
            self.send(self._parent_address, Superseded(session_id=watched.session_id,
                                                       reason=text))

    def on_store_fault(self, msg: StoreFault, sender: ActorAddress) -> None:
        watched = self.child_session(sender, CONTROLLER, msg)
        if watched is None:
            return
        if msg.session_id != watched.session_id:
            self.drop(msg, "not about its sender's session", logging.WARNING)
            return
        self.send(self._parent_address, msg)  # the root answers the program's queries

    def on_working(self, msg: Working, sender: ActorAddress) -> None:
        watched = self.child_session(sender, CONTROLLER, msg)
        if watched is not None and msg.session_id == watched.session_id:
            for role in (watched.controller, watched.runtime):  # a hung proxy holds it too
                self.mark_working(role, msg.working)
            self.send(self._parent_address, msg)  # the root probes this process

    def on_broker_slow(self, msg: BrokerSlow, sender: ActorAddress) -> None:
        if self.child_session(sender, CONTROLLER, msg) is not None:
            self.send(self._parent_address, msg)  # the root owns the broker

    def on_restart_runtime(self, msg: RestartRuntime, sender: ActorAddress) -> None:
        watched = self.child_session(sender, CONTROLLER, msg)
        if watched is not None and not self.shut:
            watched.ended = False  # the session goes on (after a stop: a fresh sandbox)
            self.restart_child(watched.runtime, msg.reason)

    def on_superseded(self, msg: Superseded, sender: ActorAddress) -> None:
        """Another Trouper restored this session and owns its log now: stand down."""
        watched = next((w for w in self.sessions.values() if sender is not None
                        and sender in (self.child(w.controller), self.child(w.runtime))),
                       None)
        if watched is None:
            self.drop(msg, "not from a live child (a replaced one's successor is in charge)")
            return
        logger.warning("session %s: %s; standing down", watched.session_id, msg.reason)
        self.forget_session(watched)  # the sandbox stays: the new owner uses it
        self.send(self._parent_address, msg)

    # -- relays --------------------------------------------------------------------

    def on_relay(self, msg: Relay, sender: ActorAddress) -> None:
        cmd = msg.msg
        if not isinstance(cmd, UserCommand):
            self.drop(msg, "it relays user commands only", logging.WARNING)
            return
        watched = self.sessions.get(cmd.session_id)
        if watched is None:  # as unknown: the program then restores the session anew
            self._refuse(msg, "UnknownSession",
                         f"session {cmd.session_id!r} is not this supervisor's")
            return
        watched.relays_seen += 1
        if watched.recording is not None:  # never a Controller beside the stand-in
            watched.woken.append(msg)
        elif self.child(watched.controller) is None:
            watched.held.append(msg)  # the Controller is restarting; released when it is up
            if self.gave_up_on(watched.controller):  # in its cooldown: a command wakes it
                self.restart_child(watched.controller,
                                   f"the user's {cmd.command} during the cooldown")
        else:
            self._hand(watched, msg)

    def _refuse(self, msg: Relay, error: str, text: str) -> None:
        cmd = msg.msg
        if msg.reply_to is None:
            self.drop(msg, text)
            return
        self.send(msg.reply_to, Refused(request_id=cmd.request_id, session_id=cmd.session_id,
                                        error=error, message=text))

    def _release_held(self, watched: Watched) -> None:
        """A Controller is up again: the commands its predecessor died holding (in their
        order; it answers those already in the log), then those held meanwhile."""
        held, watched.held = watched.in_flight.again() + watched.held, []
        for relay in held:
            self._hand(watched, relay)

    def _hand(self, watched: Watched, relay: Relay) -> None:
        controller = self.child(watched.controller)
        if controller is not None:
            watched.handed += 1
            watched.in_flight.handed(relay)
            self.send(controller, relay)
            self.watch_answer(watched.controller, relay)

    def commands_of(self, role: str) -> CommandsInFlight | None:
        kind, session_id = split_role(role)
        watched = self.sessions.get(session_id)
        return watched.in_flight if watched is not None and kind == CONTROLLER else None

    def on_command_answered(self, msg: CommandAnswered, sender: ActorAddress) -> None:
        watched = self.child_session(sender, CONTROLLER, msg)
        if watched is not None:
            watched.in_flight.answered(msg.request_id)
            self.send(self._parent_address, msg)  # the root holds it too, and answers

    def on_broker_moved(self, msg: BrokerMoved, sender: ActorAddress) -> None:
        if not self.from_parent(msg, sender, "who owns the broker"):
            return
        self.broker = msg.broker
        for watched in self.sessions.values():
            self.to_controller(watched, Rewire(broker=msg.broker,
                                               reason="the LLM broker restarted"))
