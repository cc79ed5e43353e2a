"""What the RootSupervisor keeps of each session it runs, and a settled session's stand-down.

The root starts one SessionSupervisor per session (``actors/session_supervisor.py``) and
hands it the session's user commands. It keeps, per session, what a restart or a
stand-down must not lose: the commands handed and not answered yet (``in_flight``: the
supervisor's successor gets them, ``actors/in_flight.py``), and those that came while
the supervisor was down or standing down (``held``).

A session settled for ``settled_stand_down_s`` with nothing pending stands down, so that
a program running many sessions holds only the live ones. Its Controller asks its
supervisor, which asks the root (``StandingDown``, with the number of relays it has had);
the root, if no command is on its way to it, holds the session's commands and says go
(``StandDown``). The Controller looks once more, the supervisor closes the sandbox and
says so (``SteppedDown``), and the root stops it. The next command finds no session and
restores it from its log; one that came meanwhile does at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from thespian.actors import ActorAddress

from ..messages.protocol import Refusal, Refused, StartSession
from ..messages.tree import (
    BootSession,
    CommandAnswered,
    Relay,
    StandDown,
    StandingDown,
    SteppedDown,
)
from ..supervisor import ChildSpec, Supervisor
from .in_flight import CommandsInFlight, taken_text
from .session_supervisor import SessionSupervisor

logger = logging.getLogger(__name__)

BROKER = "broker"
"""The role of the root's shared LLM broker."""

CLOSING = "the actor system is closing"
"""Why a command for a session whose supervisor is down is refused once the tree closes."""


def session_role(session_id: str) -> str:
    return f"session:{session_id}"


@dataclass
class Kept:
    """One session, as its root keeps it."""

    start: StartSession
    in_flight: CommandsInFlight = field(default_factory=CommandsInFlight)
    """User commands handed to the supervisor and not answered yet."""
    held: list[Relay] = field(default_factory=list)
    """Commands waiting for the supervisor to be up (or to have stood down) again."""
    relays_sent: int = 0
    """Relays handed to the live supervisor (it says how many it had when it asks to
    stand down)."""
    standing_down: bool = False
    """The session closes its sandbox to go: commands are held meanwhile."""
    restore_asked: bool = False
    """The program asked to start it while it stood down: start it again once it is gone."""


class RootSessions(Supervisor):
    """The root's part for its sessions (mixed into ``RootSupervisor``)."""

    session_class: type = SessionSupervisor
    """The session's supervisor; a test puts a fake in its place."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, Kept] = {}

    def start_kept(self, start: StartSession) -> None:
        """Start the session's supervisor (a restart restores it from its log)."""
        self.kept[start.session_id] = Kept(start)

        def boot(n: int) -> BootSession:
            again = start if n == 1 else start.model_copy(update={"restore": True})
            return BootSession(start=again, broker=self.child(BROKER),
                               policy=self.policy, reply_to=None)

        self.supervise(ChildSpec(session_role(start.session_id), self.session_class, boot))

    def kept_of(self, role: str) -> Kept | None:
        if not role.startswith("session:"):
            return None
        return self.kept.get(role.removeprefix("session:"))

    def forward(self, relay: Relay) -> None:
        """Hand a user command to its session's supervisor, or hold it until there is one."""
        cmd = relay.msg
        kept = self.kept.get(cmd.session_id)
        role = session_role(cmd.session_id)
        supervisor = self.child(role)
        if kept is None:
            self.refuse(relay, f"no live session {cmd.session_id!r} in this actor system",
                        Refusal.UNKNOWN_SESSION)
        elif kept.standing_down:  # its successor, or the session if it stays, takes it
            kept.held.append(relay)
        elif supervisor is not None:
            self.hand(kept, supervisor, [relay])
        elif not self.may_restart(role):
            self.refuse(relay, CLOSING)
        else:
            kept.held.append(relay)
            if self.gave_up_on(role):  # in its cooldown: a user's command wakes it now
                self.restart_child(role, f"the user's {cmd.command} during the cooldown")

    def refuse(self, relay: Relay, text: str, error: str = Refusal.INVALID_REQUEST) -> None:
        cmd = relay.msg
        if relay.reply_to is not None:
            self.send(relay.reply_to, Refused(request_id=cmd.request_id,
                                              session_id=cmd.session_id,
                                              error=error, message=text))

    def hand(self, kept: Kept, supervisor: ActorAddress, relays: list[Relay]) -> None:
        role = session_role(kept.start.session_id)
        for relay in relays:
            kept.relays_sent += 1
            kept.in_flight.handed(relay)
            self.send(supervisor, relay)
            self.watch_answer(role, relay)

    def kept_restarted(self, kept: Kept, address: ActorAddress) -> None:
        """The session's supervisor is up again: what its predecessor died holding goes
        first (its new Controller answers those already in the log), then what came since."""
        kept.relays_sent, kept.standing_down = 0, False  # a new supervisor counts afresh
        held, kept.held = kept.in_flight.again() + kept.held, []
        self.hand(kept, address, held)

    def kept_answered(self, msg: CommandAnswered, sender: ActorAddress) -> None:
        """The session answered a command: let go of it and pass the answer on."""
        kept = self.kept.get(msg.session_id)
        if kept is None or sender is None or sender != self.child(session_role(msg.session_id)):
            self.drop(msg, "not from the live supervisor of a session whose commands it holds")
            return
        kept.in_flight.answered(msg.request_id)
        if msg.reply_to is not None and msg.answer is not None:
            self.send(msg.reply_to, msg.answer)

    def refuse_spent(self, kept: Kept, reason: str) -> None:
        """The supervisor died holding commands: refuse those it may not be handed again."""
        for relay in kept.in_flight.spent():
            self.refuse(relay, taken_text(reason))

    def refuse_all(self, kept: Kept, reason: str) -> None:
        """Nobody takes the session's commands now (its supervisor is down for good)."""
        relays, kept.held = kept.in_flight.take_all() + kept.held, []
        for relay in relays:
            self.refuse(relay, taken_text(reason))

    # -- a settled session stands down --------------------------------------------

    def on_standing_down(self, msg: StandingDown, sender: ActorAddress) -> None:
        kept = self.kept.get(msg.session_id)
        role = session_role(msg.session_id)
        if kept is None or sender is None or sender != self.child(role):
            self.drop(msg, "not from the session's live supervisor")
            return
        go = (not kept.held and not kept.standing_down and not kept.in_flight.relays
              and kept.relays_sent == msg.relays and self.may_restart(role))
        kept.standing_down = go
        self.send(sender, StandDown(session_id=msg.session_id, go=go))

    def on_stepped_down(self, msg: SteppedDown, sender: ActorAddress) -> None:
        session_id = msg.session_id
        kept = self.kept.get(session_id)
        role = session_role(session_id)
        if kept is None or not kept.standing_down or sender is None \
                or sender != self.child(role):
            self.drop(msg, "not from a session standing down")
            return
        kept.standing_down = False
        # none unanswered is expected (it stands down only with none): if one is, its
        # successor takes it, as those held meanwhile
        held, kept.held = kept.in_flight.take_all() + kept.held, []
        if msg.stayed:  # it has work after all: the commands held meanwhile are its
            self.hand(kept, sender, held)
            return
        self.stop_child(role)  # its exit is expected; it starts nothing more
        del self.kept[session_id]
        if not (held or kept.restore_asked):
            logger.info("session %s: stood down, settled; the next command restores it",
                        session_id)
        elif not self.may_restart(role):
            for relay in held:
                self.refuse(relay, CLOSING)
        else:  # a command came while it stood down: its successor takes it
            logger.info("session %s: stood down; %d command(s) that came meanwhile start "
                        "it again", session_id, len(held))
            self.start_kept(kept.start.model_copy(update={"restore": True}))
            supervisor = self.child(role)
            if supervisor is not None:
                self.hand(self.kept[session_id], supervisor, held)
