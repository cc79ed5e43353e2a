"""What the RootSupervisor does for a hosted session, which has no SessionSupervisor.

In the hosted layout (``docs/architecture.md``, "Layouts") a session is one process, a
``SessionHost``, supervised by the root itself. The root then does what a
SessionSupervisor does for its Controller: it restarts the host under the policy (as for
any child), holds a session's user commands while its host restarts and hands them to
the new one, and past the restart intensity it has a stand-in host record the downtime
(the host is the log's only writer), answers who waits, and either lets the cooldown
bring the session back, wakes it at once for a user's command, or (no cooldown left)
stops it, so the program restores it anew on the next command.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from thespian.actors import ActorAddress

from ..messages.protocol import Refusal, Refused, StartSession
from ..messages.tree import (
    BootController,
    CloseFor,
    CommandAnswered,
    DowntimeRecorded,
    FailRuntime,
    RecordDowntime,
    Relay,
    Shutdown,
    StandDown,
    StandingDown,
    SteppedDown,
)
from ..supervisor import ChildSpec, Supervisor, give_up_text
from . import reaping
from .in_flight import CommandsInFlight, taken_text
from .session_host import SessionHost

logger = logging.getLogger(__name__)


BROKER = "broker"
"""The role of the root's shared LLM broker."""


def session_role(session_id: str) -> str:
    return f"session:{session_id}"


CLOSING = "the actor system is closing"
"""Why a command for a session whose host is down is refused once the tree closes."""


@dataclass
class Kept:
    """One hosted session, as its root keeps it."""

    start: StartSession
    held: list[Relay] = field(default_factory=list)
    """Commands waiting for the host to be up again."""
    woken: list[Relay] = field(default_factory=list)
    """Commands that came while the stand-in recorded the downtime: they carry the session
    on once it is recorded."""
    recording: RecordDowntime | None = None
    stand_in: ActorAddress | None = None
    """The stand-in recording the downtime."""
    close: CloseFor | None = None
    """A shutdown came while the downtime was recorded: close the sandbox once it is."""
    relays_sent: int = 0
    """Relays handed to the live host (it says how many it had when it asks to stand down)."""
    standing_down: bool = False
    """The host closes its sandbox to go: commands are held meanwhile."""
    restore_asked: bool = False
    """The program asked to start it while it stood down: start it again once it is gone."""
    in_flight: CommandsInFlight = field(default_factory=CommandsInFlight)
    """User commands handed to the host and not answered yet: its successor gets them."""


class HostedSessions(Supervisor):
    """The root's part for hosted sessions (mixed into ``RootSupervisor``)."""

    host_class: type = SessionHost
    """The hosted session's actor; a test puts a fake in its place."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, Kept] = {}
        self.closers: dict[str, ActorAddress] = {}
        """Role -> the stand-in closing that session's sandbox while the tree closes."""

    def start_closers(self, shutdown: Shutdown) -> set[str]:
        """A stand-in host for each hosted session whose host is down (restarting, in a
        cooldown), to stop its sandbox; the roles a shutdown waits for to be closed. A
        session whose downtime is being written gets its closer once it is written (one
        writer at a time)."""
        for kept in self.kept.values():
            role = session_role(kept.start.session_id)
            if self.child(role) is not None or role in self.closers:
                continue  # one closer a session, whichever shutdown started it
            close = CloseFor(start=kept.start, request_id=shutdown.request_id)
            if kept.recording is None:
                self.closers[role] = self.start_helper(self.host_class, close)
            elif kept.close is None:
                kept.close = close
        return set(self.closers) | {session_role(kept.start.session_id)
                                    for kept in self.kept.values() if kept.close is not None}

    def start_hosted(self, start: StartSession) -> None:
        self.kept[start.session_id] = Kept(start)

        def boot(n: int) -> BootController:
            again = start if n == 1 else start.model_copy(update={"restore": True})
            return BootController(start=again, broker=self.child(BROKER),
                                  runtime=None, policy=self.policy)

        self.supervise(ChildSpec(session_role(start.session_id), self.host_class, boot))

    def forward_hosted(self, kept: Kept, relay: Relay) -> None:
        """Hand ``relay`` to the session's host, or hold it until there is one."""
        cmd = relay.msg
        role = session_role(kept.start.session_id)
        host = self.child(role)
        if isinstance(cmd, FailRuntime) and (host is None or kept.recording is not None
                                             or kept.standing_down):
            self._refuse(relay, "the session's host is restarting; no driver runs now")
        elif kept.recording is not None:  # never a host beside the stand-in (one writer)
            kept.woken.append(relay)
        elif kept.standing_down:  # its successor, or the host if it stays, takes it
            kept.held.append(relay)
        elif host is not None:
            self._hand(kept, host, [relay])
        elif not self.may_restart(role):
            self._refuse(relay, CLOSING)
        else:
            kept.held.append(relay)
            if self.gave_up_on(role):  # in its cooldown: a user's command wakes it now
                self.restart_child(role, f"the user's {cmd.command} during the cooldown")

    def _refuse(self, relay: Relay, text: str) -> None:
        cmd = relay.msg
        if relay.reply_to is not None:
            self.send(relay.reply_to, Refused(request_id=cmd.request_id,
                                              session_id=cmd.session_id,
                                              error=Refusal.INVALID_REQUEST, message=text))

    def hosted_of(self, role: str) -> Kept | None:
        if not role.startswith("session:"):
            return None
        return self.kept.get(role.removeprefix("session:"))

    def forget_hosted(self, session_id: str) -> None:
        self.kept.pop(session_id, None)

    # -- the supervisor's hooks, for a hosted session ------------------------------

    def hosted_restarted(self, kept: Kept, address: ActorAddress) -> None:
        kept.relays_sent, kept.standing_down = 0, False  # a new host counts afresh
        # what its predecessor died holding goes before what came since
        held, kept.held = kept.in_flight.again() + kept.held, []
        self._hand(kept, address, held)

    def _hand(self, kept: Kept, host: ActorAddress, relays: list[Relay]) -> None:
        role = session_role(kept.start.session_id)
        for relay in relays:
            kept.relays_sent += 1
            kept.in_flight.handed(relay)
            self.send(host, relay)
            self.watch_answer(role, relay)

    def refuse_spent(self, in_flight: CommandsInFlight, reason: str) -> None:
        """A child died holding commands: refuse those it may not be handed again."""
        for relay in in_flight.spent():
            self._refuse(relay, taken_text(reason))

    def hosted_answered(self, msg: CommandAnswered, sender: ActorAddress) -> bool:
        """A host answered a command (``CommandAnswered``): let go of it and pass the
        answer on; whether it came from a live host."""
        kept = self.kept.get(msg.session_id)
        if kept is None or sender is None or sender != self.child(session_role(msg.session_id)):
            return False
        self.pass_answer(kept.in_flight, msg)
        return True

    def pass_answer(self, in_flight: CommandsInFlight, msg: CommandAnswered) -> None:
        in_flight.answered(msg.request_id)
        if msg.reply_to is not None and msg.answer is not None:
            self.send(msg.reply_to, msg.answer)

    # -- a settled session stands down --------------------------------------------

    def on_standing_down(self, msg: StandingDown, sender: ActorAddress) -> None:
        kept = self.kept.get(msg.session_id)
        role = session_role(msg.session_id)
        if kept is None or sender is None or sender != self.child(role):
            self.drop(msg, "not from the session's live host")
            return
        go = (kept.recording is None and not kept.held and not kept.woken
              and not kept.standing_down and kept.relays_sent == msg.relays
              and self.may_restart(role))
        kept.standing_down = go
        self.send(sender, StandDown(session_id=msg.session_id, go=go))

    def on_stepped_down(self, msg: SteppedDown, sender: ActorAddress) -> None:
        session_id = msg.session_id
        kept = self.kept.get(session_id)
        role = session_role(session_id)
        if kept is None or not kept.standing_down or sender is None \
                or sender != self.child(role):
            self.drop(msg, "not from a host standing down")
            return
        kept.standing_down = False
        # none unanswered is expected (the host answers before it asks to go): if one is,
        # its successor takes it, as those held meanwhile
        held, kept.held = kept.in_flight.take_all() + kept.held, []
        if msg.stayed:  # it has work after all: the commands held meanwhile are its
            self._hand(kept, sender, held)
            return
        self.stop_child(role)  # its exit is expected; it starts nothing more
        self.forget_hosted(session_id)
        if not (held or kept.restore_asked):
            logger.info("session %s: stood down, settled; the next command restores it",
                        session_id)
        elif not self.may_restart(role):
            for relay in held:
                self._refuse(relay, CLOSING)
        else:  # a command came while it stood down: its successor takes it
            logger.info("session %s: stood down; %d command(s) that came meanwhile start "
                        "it again", session_id, len(held))
            self.start_hosted(kept.start.model_copy(update={"restore": True}))
            host = self.child(role)
            if host is not None:
                self._hand(self.kept[session_id], host, held)

    def hosted_gave_up(self, kept: Kept, reason: str, retry_in_s: float | None) -> None:
        """Nobody drives the session now: a stand-in host records ERROR (the log's one
        writer); who waits is answered once it is recorded."""
        text, resumes_at = give_up_text("the agent loop", self.policy, reason, retry_in_s)
        logger.error("session %s: %s", kept.start.session_id, text)
        for relay in kept.in_flight.take_all():  # no host takes them: the stand-in records
            self._refuse(relay, taken_text(reason))
        kept.recording = RecordDowntime(start=kept.start, reason=text, resumes_at=resumes_at)
        kept.stand_in = self.start_helper(self.host_class, kept.recording)

    def on_downtime_recorded(self, msg: DowntimeRecorded, sender: ActorAddress) -> None:
        kept = self.kept.get(msg.session_id)
        if kept is None or kept.recording is None or sender != kept.stand_in:
            self.drop(msg, "no downtime of that session is being recorded by its sender")
            return
        if msg.error:
            logger.error("session %s: the downtime is not in the log: %s",
                         msg.session_id, msg.error)
        self._downtime_settled(kept)

    def on_helper_exited(self, address: ActorAddress) -> None:
        for role, closer in list(self.closers.items()):
            if closer == address:
                del self.closers[role]
        for kept in list(self.kept.values()):
            if kept.recording is not None and kept.stand_in == address:
                failed = reaping.start_failure(address)
                logger.error("session %s: the stand-in exited before it recorded the "
                             "downtime%s", kept.start.session_id,
                             f" (its process could not be started: {failed})" if failed else "")
                self.downtime_unrecorded(kept.start.session_id, kept.recording.reason)
                self._downtime_settled(kept)

    def downtime_unrecorded(self, session_id: str, text: str) -> None:
        """The session is down and its log cannot say so (no process to write it could be
        started): the root tells its clients instead, until the session starts again."""

    def _downtime_settled(self, kept: Kept) -> None:
        assert kept.recording is not None
        text, resumes_at = kept.recording.reason, kept.recording.resumes_at
        kept.recording, kept.stand_in = None, None
        held, kept.held = kept.held, []
        for relay in held:
            self._refuse(relay, text)
        session_id = kept.start.session_id
        role = session_role(session_id)
        if kept.close is not None:  # a shutdown waits for this session's sandbox to stop
            self.closers[role] = self.start_helper(self.host_class, kept.close)
            kept.close = None
        if kept.woken and not self.may_restart(role):  # closing: no host starts again
            woken, kept.woken = kept.woken, []
            for relay in woken:
                self._refuse(relay, CLOSING)
        elif kept.woken:  # answered by the host they start, as a resume in a cooldown is
            kept.held, kept.woken = kept.woken, []
            command = getattr(kept.held[0].msg, "command", "command")
            self.restart_child(role, f"the user's {command} once the downtime was recorded")
        elif resumes_at is None:  # down for good: the program restores it on its next command
            logger.warning("session %s: stopping its host: %s", session_id, text)
            self.stop_child(role)
            self.forget_hosted(session_id)

