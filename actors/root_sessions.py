"""What the RootSupervisor keeps of each session it runs, the groups its SessionSupervisors
watch, and a settled session's stand-down.

The root hands each new session to a SessionSupervisor with room (``sessions_per_supervisor``
a group; a new one is started when none has room) and hands it the session's user
commands. It keeps, per session, what a restart or a stand-down must not lose: the
commands handed and not answered yet (``in_flight``: handed again to the supervisor's
successor, ``actors/in_flight.py``), and those that came while the supervisor was down
or the session stood down (``held``). A supervisor that dies is restarted and given its
sessions again, each restored from its log; one that cannot be started makes each of its
sessions a fault for its clients (no Controller can write their logs).

A session settled for ``settled_stand_down_s`` with nothing pending stands down, so that
a program running many sessions holds only the live ones. Its Controller asks its
supervisor, which asks the root (``StandingDown``, with the number of relays it has had);
the root, if no command is on its way, holds the session's commands and says go
(``StandDown``). The Controller looks once more, the supervisor closes the sandbox, its
two children go, and the root hears ``SteppedDown``. The next command finds no session
and restores it from its log; one that came meanwhile does at once.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from thespian.actors import ActorAddress

from ..config.settings import settings
from ..messages.protocol import Refusal, Refused, StartSession
from ..messages.tree import (
    BootGroup,
    CommandAnswered,
    Relay,
    StandDown,
    StandingDown,
    SteppedDown,
    WatchSession,
)
from ..supervisor import ChildSpec, Supervisor
from .in_flight import CommandsInFlight, taken_text
from .session_supervisor import SessionSupervisor

logger = logging.getLogger(__name__)

BROKER = "broker"
"""The role of the root's shared LLM broker."""

CLOSING = "the actor system is closing"
"""Why a command for a session whose supervisor is down is refused once the tree closes."""


@dataclass
class Kept:
    """One session, as its root keeps it."""

    start: StartSession
    group: str
    """The role of the SessionSupervisor that watches it."""
    in_flight: CommandsInFlight = field(default_factory=CommandsInFlight)
    """User commands handed to the supervisor and not answered yet."""
    held: list[Relay] = field(default_factory=list)
    """Commands waiting for the supervisor to be up (or the session to stand down)."""
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
    """The sessions' supervisor; a test puts a fake in its place."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, Kept] = {}
        self.groups: dict[str, set[str]] = {}
        """Each SessionSupervisor's role -> the sessions it watches."""
        self._group_numbers = itertools.count(1)

    def start_kept(self, start: StartSession) -> None:
        """Hand the session to a supervisor with room (a restart restores it from its log)."""
        group = self._group_with_room()
        self.kept[start.session_id] = Kept(start, group)
        self.groups[group].add(start.session_id)
        supervisor = self.child(group)
        if supervisor is not None:  # else its restart hands it every session it had
            self.send(supervisor, WatchSession(start=start))

    def _group_with_room(self) -> str:
        room = settings().sessions_per_supervisor
        for group, members in self.groups.items():
            if len(members) < room and self.child(group) is not None:
                return group
        group = f"group:{next(self._group_numbers)}"
        self.groups[group] = set()
        self.supervise(ChildSpec(group, self.session_class, lambda n: BootGroup(
            broker=self.child(BROKER), policy=self.policy)))
        return group

    def kept_in(self, role: str) -> list[Kept]:
        """The sessions the supervisor in ``role`` watches."""
        return [self.kept[s] for s in self.groups.get(role, ()) if s in self.kept]

    def forget(self, session_id: str) -> Kept | None:
        """The session leaves the tree; a supervisor left with none goes too."""
        kept = self.kept.pop(session_id, None)
        if kept is not None:
            members = self.groups.get(kept.group, set())
            members.discard(session_id)
            if not members:
                self.groups.pop(kept.group, None)
                self.stop_child(kept.group)
        return kept

    def from_session(self, session_id: str, sender: ActorAddress, msg: object) -> Kept | None:
        """The session if ``sender`` is its live supervisor; else ``msg`` is dropped."""
        kept = self.kept.get(session_id)
        if kept is not None and sender is not None and sender == self.child(kept.group):
            return kept
        self.drop(msg, f"not from session {session_id}'s live supervisor")
        return None

    def forward(self, relay: Relay) -> None:
        """Hand a user command to its session's supervisor, or hold it until there is one."""
        cmd = relay.msg
        kept = self.kept.get(cmd.session_id)
        if kept is None:
            self.refuse(relay, f"no live session {cmd.session_id!r} in this actor system",
                        Refusal.UNKNOWN_SESSION)
            return
        supervisor = self.child(kept.group)
        if kept.standing_down:  # its successor, or the session if it stays, takes it
            kept.held.append(relay)
        elif supervisor is not None:
            self.hand(kept, supervisor, [relay])
        elif not self.may_restart(kept.group):
            self.refuse(relay, CLOSING)
        else:
            kept.held.append(relay)
            if self.gave_up_on(kept.group):  # in its cooldown: a user's command wakes it
                self.restart_child(kept.group, f"the user's {cmd.command} during the cooldown")

    def refuse(self, relay: Relay, text: str, error: str = Refusal.INVALID_REQUEST) -> None:
        cmd = relay.msg
        if relay.reply_to is not None:
            self.send(relay.reply_to, Refused(request_id=cmd.request_id,
                                              session_id=cmd.session_id,
                                              error=error, message=text))

    def hand(self, kept: Kept, supervisor: ActorAddress, relays: list[Relay]) -> None:
        for relay in relays:
            kept.relays_sent += 1
            kept.in_flight.handed(relay)
            self.send(supervisor, relay)
            self.watch_answer(kept.group, relay)

    def group_restarted(self, role: str, address: ActorAddress) -> None:
        """A supervisor is up again: each of its sessions is restored from its log, and
        what its predecessor died holding goes first, then what came since."""
        for kept in self.kept_in(role):
            self.send(address, WatchSession(start=kept.start.model_copy(
                update={"restore": True})))
            kept.relays_sent, kept.standing_down = 0, False  # it counts afresh
            held, kept.held = kept.in_flight.again() + kept.held, []
            self.hand(kept, address, held)

    def commands_of(self, role: str) -> CommandsInFlight | None:
        if role not in self.groups:
            return None
        merged = CommandsInFlight()  # (the probe only asks whether one is still in flight)
        for kept in self.kept_in(role):
            merged.relays.update(kept.in_flight.relays)
        return merged

    def on_command_answered(self, msg: CommandAnswered, sender: ActorAddress) -> None:
        """The session answered a command: let go of it and pass the answer on."""
        kept = self.from_session(msg.session_id, sender, msg)
        if kept is None:
            return
        kept.in_flight.answered(msg.request_id)
        if msg.reply_to is not None and msg.answer is not None:
            self.send(msg.reply_to, msg.answer)

    def refuse_spent(self, role: str, reason: str) -> None:
        """A supervisor died holding commands: refuse those it may not be handed again."""
        for kept in self.kept_in(role):
            for relay in kept.in_flight.spent():
                self.refuse(relay, taken_text(reason))

    def refuse_all(self, kept: Kept, reason: str) -> None:
        """Nobody takes the session's commands now (its supervisor is down for good)."""
        relays, kept.held = kept.in_flight.take_all() + kept.held, []
        for relay in relays:
            self.refuse(relay, taken_text(reason))

    # -- a settled session stands down --------------------------------------------

    def on_standing_down(self, msg: StandingDown, sender: ActorAddress) -> None:
        kept = self.from_session(msg.session_id, sender, msg)
        if kept is None:
            return
        go = (not kept.held and not kept.standing_down and not kept.in_flight.relays
              and kept.relays_sent == msg.relays and self.may_restart(kept.group))
        kept.standing_down = go
        self.send(sender, StandDown(session_id=msg.session_id, go=go))

    def on_stepped_down(self, msg: SteppedDown, sender: ActorAddress) -> None:
        session_id = msg.session_id
        kept = self.from_session(session_id, sender, msg)
        if kept is None:
            return
        if not kept.standing_down:
            self.drop(msg, "that session is not standing down")
            return
        kept.standing_down = False
        # none unanswered is expected (it stands down only with none): if one is, its
        # successor takes it, as those held meanwhile
        held, kept.held = kept.in_flight.take_all() + kept.held, []
        if msg.stayed:  # it has work after all: the commands held meanwhile are its
            self.hand(kept, sender, held)
            return
        self.forget(session_id)  # its supervisor let its children go
        if not (held or kept.restore_asked):
            logger.info("session %s: stood down, settled; the next command restores it",
                        session_id)
        elif not self.may_restart(kept.group):
            for relay in held:
                self.refuse(relay, CLOSING)
        else:  # a command came while it stood down: its successor takes it
            logger.info("session %s: stood down; %d command(s) that came meanwhile start "
                        "it again", session_id, len(held))
            self.start_kept(kept.start.model_copy(update={"restore": True}))
            again = self.kept[session_id]
            supervisor = self.child(again.group)
            if supervisor is not None:
                self.hand(again, supervisor, held)
            else:
                again.held = held
