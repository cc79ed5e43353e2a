"""SessionSupervisor: one per session; supervises its RuntimeProxy and Controller.

It restarts either child under the session's policy, tells the Controller when the
runtime went down and came back (so it can resolve in-flight actions from the journal),
and relays user commands to the Controller, holding them while it restarts.

It heeds only what comes from where it should (I5/I6, docs/promises.md): lifecycle reports from its
current proxy, requests for the sandbox or the store from its current Controller, the
broker's move from its parent, commands for its own session. Anything else (a replaced
incarnation's late report, a second boot, junk) is dropped with a log line.
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
    StartSession,
    StoreFault,
    UserCommand,
)
from ..messages.tree import (
    BootController,
    BootRuntime,
    BootSession,
    BrokerMoved,
    BrokerSlow,
    CommandAnswered,
    DowntimeRecorded,
    RecordDowntime,
    Relay,
    RestartRuntime,
    Rewire,
    RuntimeGaveUp,
    StandDown,
    StandingDown,
    SteppedDown,
    Superseded,
    Working,
)
from ..supervisor import ChildSpec, give_up_text
from .controller import Controller
from .in_flight import CommandsInFlight, taken_text
from .runtime_proxy import RuntimeProxy
from .sandbox_closing import CONTROLLER, RUNTIME, STAND_DOWN, SandboxClosing

logger = logging.getLogger(__name__)

class SessionSupervisor(SandboxClosing):
    role = "session"
    runtime_class: type = RuntimeProxy
    """The actor that owns the sandbox; a test puts a fake in its place."""
    controller_class: type = Controller

    def __init__(self) -> None:
        super().__init__()
        self.start: StartSession | None = None
        self.broker: ActorAddress | None = None
        self.ready: RuntimeReady | None = None
        self.held: list[Relay] = []
        self.first_reply: ActorAddress | None = None
        self.down_for_good = ""
        """Why the agent loop stays down until the root stops this session ("": it does not)."""
        self.relays_seen = 0
        """Relays received from the root (the stand-down says how many)."""
        self.handed = 0
        """Relays handed to the live Controller."""
        self.recording: RecordDowntime | None = None
        """The agent loop's downtime, while a stand-in Controller records it."""
        self.in_flight = CommandsInFlight()
        """User commands handed to the Controller and not answered yet."""
        self.woken: list[Relay] = []
        """User commands that came while the downtime was recorded: the user saw ERROR
        in the log and answered it, so they carry the session on once it is recorded."""

    @property
    def session_id(self) -> str:
        return self.start.session_id if self.start else ""

    def _from(self, sender: ActorAddress, role: str, msg: Any) -> bool:
        """Whether ``sender`` is the live child in ``role``; if not, ``msg`` is dropped."""
        if sender is not None and sender == self.child(role):
            return True
        self.drop(msg, f"not from its current {role} (a replaced one's late word, or junk)")
        return False

    def on_boot_session(self, msg: BootSession, sender: ActorAddress) -> None:
        self.set_parent(sender)
        self.policy, self.start, self.broker = msg.policy, msg.start, msg.broker
        start = msg.start
        self.publish_pid(Home.at(start.home).actor_pid_path("session", start.session_id))
        runtime = self.supervise(ChildSpec(
            RUNTIME, self.runtime_class, lambda n: BootRuntime(start=start)))
        self.first_reply = msg.reply_to

        def boot_controller(n: int) -> BootController:
            reply_to = self.first_reply if n == 1 else None
            again = start if n == 1 else start.model_copy(update={"restore": True})
            return BootController(start=again, broker=self.broker,  # type: ignore[arg-type]
                                  runtime=self.child(RUNTIME), reply_to=reply_to)

        self.supervise(ChildSpec(CONTROLLER, self.controller_class, boot_controller))
        logger.info("session %s: supervisor up (runtime %s)", start.session_id, runtime)

    # -- runtime lifecycle ------------------------------------------------------------

    def on_runtime_ready(self, msg: RuntimeReady, sender: ActorAddress) -> None:
        if self._from(sender, RUNTIME, msg):
            self.ready = msg
            self._to_controller(msg)

    def on_runtime_progress(self, msg: RuntimeProgress, sender: ActorAddress) -> None:
        if self._from(sender, RUNTIME, msg):
            self._to_controller(msg)  # the Controller records it: the log's one writer

    def on_runtime_failed(self, msg: RuntimeFailed, sender: ActorAddress) -> None:
        # from a dead proxy, after its successor said ready, it would leave the Controller
        # in ERROR waiting for a RuntimeReady that already came
        if self._from(sender, RUNTIME, msg):
            self.ready = None
            self._to_controller(msg)

    def runtime_ended(self) -> None:
        self.ready = None  # else a restarted Controller would be told it is ready

    def on_child_down(self, role: str, reason: str) -> None:
        if role == RUNTIME:
            self.runtime_lost()
        if role == CONTROLLER:  # what it may not be handed again is refused now
            self.stay()
            for relay in self.in_flight.spent():
                self._refuse(relay, relay.msg, Refusal.INVALID_REQUEST, taken_text(reason))
        # A proxy that reported its failure first already told the Controller; one killed
        # outright (or before it was ready) did not.
        if role == RUNTIME and self.start is not None and self.ready is not None:
            self.ready = None
            self._to_controller(RuntimeFailed(
                session_id=self.start.session_id, epoch=0, cause=RuntimeFailure.EXITED,
                detail=reason))

    def on_child_restarted(
        self, role: str, address: ActorAddress, incarnation: int, reason: str
    ) -> None:
        if role == RUNTIME:
            self._to_controller(Rewire(runtime=address, reason=reason))
        elif role == CONTROLLER:
            self.handed = 0  # a new Controller counts afresh
            if self.ready is not None:
                self.send(address, self.ready)
            self._release_held()

    def on_child_gave_up(self, role: str, reason: str, retry_in_s: float | None) -> None:
        what = "the sandbox" if role == RUNTIME else "the agent loop"
        text, resumes_at = give_up_text(what, self.policy, reason, retry_in_s)
        if role == RUNTIME:
            self.runtime_lost()
            self.ready = None  # else a restarted Controller would be told it is ready
            self._to_controller(RuntimeGaveUp(reason=text, resumes_at=resumes_at))
        else:
            self.stay()
            for relay in self.in_flight.take_all():  # no Controller takes them now
                self._refuse(relay, relay.msg, Refusal.INVALID_REQUEST, taken_text(reason))
            self._controller_gave_up(text, resumes_at)

    def _controller_gave_up(self, text: str, resumes_at: datetime | None) -> None:
        """Nobody drives the session now. The Controller is the log's only writer, so a
        stand-in incarnation records ERROR; who waits is answered once it is recorded."""
        assert self.start is not None
        logger.error("session %s: %s", self.session_id, text)
        self.recording = RecordDowntime(start=self.start, reason=text, resumes_at=resumes_at)
        self.start_helper(self.controller_class, self.recording)

    def on_downtime_recorded(self, msg: DowntimeRecorded, sender: ActorAddress) -> None:
        if self.recording is None or msg.session_id != self.session_id:
            self.drop(msg, "no downtime of this session is being recorded")
            return
        if msg.error:
            logger.error("session %s: the downtime is not in the log: %s",
                         self.session_id, msg.error)
        self._downtime_settled()

    def on_helper_exited(self, address: ActorAddress) -> None:
        if self.closer_exited(address):
            return
        if self.recording is not None:  # it died before it answered
            logger.error("session %s: the stand-in Controller exited before it recorded "
                         "the downtime", self.session_id)
            self._downtime_settled()

    def _downtime_settled(self) -> None:
        """Answer who waits for the loop, and (down for good) ask the root to stop it."""
        assert self.start is not None and self.recording is not None
        text, resumes_at = self.recording.reason, self.recording.resumes_at
        self.recording = None
        session_id = self.start.session_id
        waiting = [(self.first_reply, self.start.request_id)]
        waiting += [(h.reply_to, getattr(h.msg, "request_id", "")) for h in self.held]
        self.held, self.first_reply = [], None
        for reply_to, request_id in waiting:
            if reply_to is not None:
                self.send(reply_to, Refused(request_id=request_id, session_id=session_id,
                                            error=Refusal.INVALID_REQUEST, message=text))
        if self.woken:  # answered by the Controller they start, as a resume in a cooldown is
            self.held, self.woken = self.woken, []
            command = self.held[0].msg.command  # type: ignore[attr-defined]
            self.restart_child(CONTROLLER, f"the user's {command} once the downtime was recorded")
            return
        if resumes_at is None:
            self.down_for_good = text  # the root stops this session; refuse until then
            self.send(self._parent_address, Superseded(session_id=session_id, reason=text))

    def on_store_fault(self, msg: StoreFault, sender: ActorAddress) -> None:
        if not self._from(sender, CONTROLLER, msg):
            return
        if msg.session_id != self.session_id:
            self.drop(msg, "not about this session", logging.WARNING)
            return
        self.send(self._parent_address, msg)  # the root answers the program's queries

    def on_working(self, msg: Working, sender: ActorAddress) -> None:
        if self._from(sender, CONTROLLER, msg):
            for role in (CONTROLLER, RUNTIME):  # a hung proxy would hold the session too
                self.mark_working(role, msg.working)
            self.send(self._parent_address, msg)  # the root probes this process

    def on_broker_slow(self, msg: BrokerSlow, sender: ActorAddress) -> None:
        if self._from(sender, CONTROLLER, msg):
            self.send(self._parent_address, msg)  # the root owns the broker

    def on_restart_runtime(self, msg: RestartRuntime, sender: ActorAddress) -> None:
        if self._from(sender, CONTROLLER, msg) and not self.shut:
            self.ended = False  # the session goes on (after a stop: a fresh sandbox)
            self.restart_child(RUNTIME, msg.reason)

    def on_superseded(self, msg: Superseded, sender: ActorAddress) -> None:
        """Another Trouper restored this session and owns its log now: stand down."""
        if sender is None or sender not in (self.child(CONTROLLER), self.child(RUNTIME)):
            self.drop(msg, "not from a live child (a replaced one's successor is in charge)")
            return
        logger.warning("session %s: %s; standing down", msg.session_id, msg.reason)
        self.stop_child(CONTROLLER)
        self.stop_child(RUNTIME)  # the sandbox stays: the new owner uses it
        self.send(self._parent_address, msg)

    # -- relays --------------------------------------------------------------------

    def on_relay(self, msg: Relay, sender: ActorAddress) -> None:
        cmd = msg.msg
        self.relays_seen += 1
        if not isinstance(cmd, UserCommand):
            self.drop(msg, "it relays user commands only", logging.WARNING)
        elif self.start is None:
            self._refuse(msg, cmd, "UnknownSession", "this session is not booted yet")
        elif cmd.session_id != self.session_id:
            self._refuse(msg, cmd, "UnknownSession",
                         f"session {cmd.session_id!r} is not this supervisor's")
        elif self.down_for_good:  # as unknown: the program then restores the session anew
            self._refuse(msg, cmd, "UnknownSession",
                         f"{self.down_for_good}; this session's actors are stopping")
        elif self.recording is not None:  # never a Controller beside the stand-in (one writer)
            self.woken.append(msg)
        elif self.child(CONTROLLER) is None:
            self.held.append(msg)  # the Controller is restarting; released when it is up
            if self.gave_up_on(CONTROLLER):  # in its cooldown: a user's command wakes it now
                self.restart_child(CONTROLLER, f"the user's {cmd.command} during the cooldown")
        else:
            self._hand(msg)

    def _refuse(self, msg: Relay, cmd: UserCommand, error: str,
                text: str) -> None:
        if msg.reply_to is None:
            self.drop(msg, text)
            return
        self.send(msg.reply_to, Refused(request_id=cmd.request_id, session_id=cmd.session_id,
                                        error=error, message=text))

    def _release_held(self) -> None:
        """A Controller is up again: the commands its predecessor died holding (in their
        order; it answers those already in the log), then those held meanwhile."""
        held, self.held = self.in_flight.again() + self.held, []
        for msg in held:
            self._hand(msg)

    def _hand(self, relay: Relay) -> None:
        controller = self.child(CONTROLLER)
        if controller is not None:
            self.handed += 1
            self.in_flight.handed(relay)
            self.send(controller, relay)
            self.watch_answer(CONTROLLER, relay)

    def commands_of(self, role: str) -> CommandsInFlight | None:
        return self.in_flight if role == CONTROLLER else None

    def on_command_answered(self, msg: CommandAnswered, sender: ActorAddress) -> None:
        if self._from(sender, CONTROLLER, msg):
            self.in_flight.answered(msg.request_id)
            self.send(self._parent_address, msg)  # the root holds it too, and answers

    def on_broker_moved(self, msg: BrokerMoved, sender: ActorAddress) -> None:
        if not self.from_parent(msg, sender, "who owns the broker"):
            return
        self.broker = msg.broker
        self._to_controller(Rewire(broker=msg.broker, reason="the LLM broker restarted"))

    # -- a settled session stands down (``actors/root_sessions.py``) --------------------

    def on_standing_down(self, msg: StandingDown, sender: ActorAddress) -> None:
        """The Controller has been settled for ``settled_stand_down_s``: ask the root,
        unless a command is on its way to it or anything else is under way here."""
        if not self._from(sender, CONTROLLER, msg):
            return
        quiet = (self.handed == msg.relays and not self.held and not self.woken
                 and self.recording is None and not self.in_flight.relays
                 and not (self.shut or self.down_for_good or self.close_under_way
                          or self.standing_down))
        if not quiet:
            self.send(sender, StandDown(session_id=self.session_id, go=False))
            return
        self.standing_down = True
        self.send(self._parent_address, StandingDown(session_id=self.session_id,
                                                     relays=self.relays_seen))

    def on_stand_down(self, msg: StandDown, sender: ActorAddress) -> None:
        if not self.from_parent(msg, sender, "who supervises the session"):
            return
        if not self.standing_down:
            self.drop(msg, "it asked for no stand-down")
            return
        if not msg.go:
            self.standing_down = False
        controller = self.child(CONTROLLER)
        if controller is not None:
            self.send(controller, msg)  # go: the Controller looks once more
        elif msg.go:
            self.stay()

    def on_stepped_down(self, msg: SteppedDown, sender: ActorAddress) -> None:
        if not self._from(sender, CONTROLLER, msg):
            return
        if not self.standing_down:
            self.drop(msg, "no stand-down is under way")
        elif msg.stayed:
            self.stay()
        else:
            logger.info("session %s: settled: closing its sandbox and standing down (the "
                        "next command restores it)", self.session_id)
            self._close_sandbox(STAND_DOWN)

    def stay(self) -> None:
        """A stand-down the root said go to is off: the commands it holds come here."""
        if self.standing_down:
            self.standing_down = False
            self.send(self._parent_address, SteppedDown(session_id=self.session_id,
                                                        stayed=True))
