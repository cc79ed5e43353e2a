"""A supervisor asks a child that keeps a command unanswered whether it still answers,
and kills it when it does not, so that it is restarted.

A child that dies is restarted (``supervision.py``) and the commands it held are handed
to its successor (``in_flight.py``). A child that hangs (stopped by SIGSTOP, deadlocked,
starved) did not die: its session stood still for ever, and every command to it waited a
program's whole request timeout and was lost. Watching every child all the time would
cost an idle session CPU; what betrays a hung child is a command it leaves unanswered
(they are answered in milliseconds). So a parent that handed a user's command on sets a
timer (``unanswered_probe_s``); if the command is still in flight when it fires, the
parent sends the child a ``Probe``, which every actor answers first thing
(``TrouperActor._dispatch``), whatever it is waiting for. No answer within
``probe_answer_s``: the parent SIGKILLs the child's process, Thespian reports the exit,
and the supervisor restarts it as after a crash, its last words saying why.
"""

from __future__ import annotations

import logging
import signal
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thespian.actors import ActorAddress

from ..config.settings import settings
from ..host.processes import signal_quietly
from ..messages.protocol import UserCommand
from ..messages.tree import BootedUp, Probe, ProbeAnswer, Relay
from ..observability import metrics
from . import reaping
from .base import TrouperActor

if TYPE_CHECKING:
    from .in_flight import CommandsInFlight

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Probe:
    token: str
    incarnation: int
    why: str


class Probing(TrouperActor):
    """The probing half of ``Supervisor`` (which keeps ``_children``); its subclasses say
    where a child's unanswered commands are kept (``commands_of``)."""

    _children: dict[str, Any]

    def __init__(self) -> None:
        super().__init__()
        self._probes: dict[str, _Probe] = {}
        """role -> the probe sent to it and not answered yet."""
        self._up: dict[str, int] = {}
        """role -> the incarnation that said it booted (``BootedUp``): only those are probed."""
        self._working: set[str] = set()
        """Children whose session works (``loop_watch.Working``): probed now and then."""
        self._working_timer = False

    def forget_probing(self, role: str) -> None:
        """``role`` is stopped for good: nothing of it to probe any more."""
        self._probes.pop(role, None)
        self._up.pop(role, None)
        self._working.discard(role)

    def commands_of(self, role: str) -> CommandsInFlight | None:
        """The user commands handed to ``role`` and not yet answered (None: it takes none)."""
        return None

    def watch_answer(self, role: str, relay: Relay) -> None:
        """``relay`` went to ``role``: if it is a user's command, probe ``role`` should the
        command still be unanswered after ``unanswered_probe_s``."""
        if isinstance(relay.msg, UserCommand):
            self.after(settings().unanswered_probe_s, "unanswered",
                       (role, relay.msg.request_id))

    def on_timer_unanswered(self, token: tuple[str, str]) -> None:
        role, request_id = token
        kept = self.commands_of(role)
        if kept is None or request_id not in kept.relays or self._stopping:
            return  # answered (or refused) meanwhile: the usual case
        self.probe(role, f"a user's command waited {settings().unanswered_probe_s:g} s for "
                         "its answer")

    def on_booted_up(self, msg: BootedUp, sender: ActorAddress) -> None:
        for role, child in self._children.items():
            if child.address is not None and child.address == sender:
                self._up[role] = child.incarnation
                return
        self.drop(msg, "not from a live child")

    def mark_working(self, role: str, working: bool) -> None:
        """Probe ``role`` every ``working_probe_s`` while ``working`` (its session is not
        settled: a hung process there would leave it standing still)."""
        if not working:
            self._working.discard(role)
            return
        self._working.add(role)
        if not self._working_timer:
            self._working_timer = True
            self.after(settings().working_probe_s, "probe_working")

    def on_timer_probe_working(self, _token: object) -> None:
        self._working_timer = False
        for role in list(self._working):
            if role not in self._children:
                self._working.discard(role)  # stopped, stood down: gone
            elif not self._stopping:
                self.probe(role, "its session kept working")
        if self._working and not self._stopping:
            self._working_timer = True
            self.after(settings().working_probe_s, "probe_working")

    def probe(self, role: str, why: str) -> None:
        """Ask ``role`` whether it answers; kill its process if it does not in time."""
        probes = self._probes
        child = self._children.get(role)
        if child is None or child.address is None or role in probes \
                or self._up.get(role) != child.incarnation:
            return  # restarting, still booting (its boot may read a long log), or asked
        pending = _Probe(uuid.uuid4().hex[:16], child.incarnation, why)
        probes[role] = pending
        self.send(child.address, Probe(token=pending.token))
        metrics.probed(role, why)
        self.after(settings().probe_answer_s, "probe_unanswered", (role, pending.token))

    def on_probe_answer(self, msg: ProbeAnswer, sender: ActorAddress) -> None:
        probes = self._probes
        for role, pending in list(probes.items()):
            child = self._children.get(role)
            if pending.token == msg.token and child is not None and child.address == sender:
                del probes[role]
                return
        self.drop(msg, "not the answer to a probe it sent")

    def on_timer_probe_unanswered(self, token: tuple[str, str]) -> None:
        role, probe_token = token
        probes = self._probes
        pending = probes.get(role)
        if pending is None or pending.token != probe_token:
            return  # answered
        del probes[role]
        child = self._children.get(role)
        if self._stopping or child is None or child.address is None \
                or child.incarnation != pending.incarnation:
            return  # it died and was restarted meanwhile, or the tree is closing
        pid = reaping.child_pid(self, child.address)
        if pid is None:
            logger.warning("%s: child %s did not answer a probe, and its process is not "
                           "known; left", self.role, role)
            return
        hung_s = settings().probe_answer_s
        child.last_words = (f"hung: it did not answer for {hung_s:g} s after {pending.why}, "
                            "so its process was killed")
        logger.warning("%s: child %s (pid %d) %s", self.role, role,
                       pid, child.last_words)
        signal_quietly(pid, signal.SIGKILL)  # its exit is reported as any other: a restart
        metrics.probe_killed(role)
