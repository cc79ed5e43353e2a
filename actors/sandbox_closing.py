"""What a SessionSupervisor does to close the sandboxes of its sessions, and to let a
settled session stand down.

Three things close a session's sandbox: the session stopping (``EndSandbox`` from its
Controller, answered ``SandboxClosed`` once the sandbox is ended), the tree shutting down
(``Shutdown``, answered ``ShutdownDone`` once every session's sandbox is closed) and a
settled session standing down (``actors/root_sessions.py``: its children go once it is
closed, and the root hears ``SteppedDown``). One close runs at a time per session and
answers every request waiting for it. The session's live RuntimeProxy does it; when none
is live (restarting after a crash, given up on past the restart intensity, killed during
the close) a one-shot proxy does (``CloseFor``): before, a shutdown that found the proxy
down was answered at once and the sandbox left (a container killed under a busy run
stayed ``Exited`` after the program's close), and a restart timer firing after the
shutdown started a fresh one.

Once a sandbox is ended no proxy starts until the Controller asks (``RestartRuntime``, the
session going on), and after a shutdown none starts at all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from thespian.actors import ActorAddress

from ..messages.protocol import CloseSandbox, SandboxClosed
from ..messages.tree import (
    CloseFor,
    EndSandbox,
    ForgetHistory,
    Shutdown,
    ShutdownDone,
    StandDown,
    StandingDown,
    SteppedDown,
)
from ..supervisor import Supervisor
from .watched import CONTROLLER, RUNTIME, Watched, child_role, split_role

logger = logging.getLogger(__name__)

END = "end"
"""The request id of the close an end makes."""
STAND_DOWN = "stand-down"
"""The request id of the close a settled session's stand-down makes."""


@dataclass
class _GroupClose:
    """One shutdown under way: who asked, whose sandboxes it waits for, which closed."""

    request_id: str
    reply_to: ActorAddress
    waiting: set[str]
    closed: list[str] = field(default_factory=list)


class SandboxClosing(Supervisor):
    """The sandbox closes of a group of sessions, and their stand-downs (mixed into
    ``SessionSupervisor``)."""

    runtime_class: type
    sessions: dict[str, Watched]
    broker: ActorAddress | None

    def __init__(self) -> None:
        super().__init__()
        self.shutdowns: list[_GroupClose] = []
        """Shutdowns waiting for sandboxes to close; each is answered once."""
        self.shut = False
        """A shutdown came: nothing starts again."""

    def may_restart(self, role: str) -> bool:
        kind, session_id = split_role(role)
        watched = self.sessions.get(session_id)
        return (watched is not None and not self.shut
                and not (kind == RUNTIME and watched.ended))

    def child_session(self, sender: ActorAddress, kind: str, msg: Any) -> Watched | None:
        """The session whose live child in ``kind`` (``runtime``, ``controller``) is
        ``sender``; if none, ``msg`` is dropped."""
        if sender is not None:
            for watched in self.sessions.values():
                if sender == self.child(child_role(kind, watched.session_id)):
                    return watched
        self.drop(msg, f"not from a current {kind} of its sessions (a replaced one's late "
                       "word, or junk)")
        return None

    def to_controller(self, watched: Watched, msg: Any) -> None:
        controller = self.child(watched.controller)
        if controller is not None:
            self.send(controller, msg)

    def on_end_sandbox(self, msg: EndSandbox, sender: ActorAddress) -> None:
        watched = self.child_session(sender, CONTROLLER, msg)
        if watched is None:
            return
        logger.info("session %s: ending its sandbox (%s)", watched.session_id, msg.reason)
        watched.ended, watched.end_waits = True, True
        watched.ready = None  # it is not ready for anyone now
        self.close_sandbox(watched, END)

    def on_shutdown(self, msg: Shutdown, sender: ActorAddress) -> None:
        self.shut = bool(self.sessions)  # (one watching none has nothing to close)
        if not msg.stop_sandboxes or not self.sessions:
            self.send(sender, ShutdownDone(request_id=msg.request_id))
            return
        self.shutdowns.append(_GroupClose(msg.request_id, sender, set(self.sessions)))
        for watched in list(self.sessions.values()):
            self.close_sandbox(watched, msg.request_id)

    def close_sandbox(self, watched: Watched, request_id: str) -> None:
        """Close the sandbox: through the live proxy, or a one-shot one when it is down;
        a close under way answers whoever waits when it is done."""
        if watched.close_under_way is not None:
            return
        watched.close_under_way = request_id
        runtime = self.child(watched.runtime)
        if runtime is not None:
            self.send(runtime, CloseSandbox(request_id=request_id))
            return
        watched.closer = self.start_helper(
            self.runtime_class, CloseFor(start=watched.start, request_id=request_id))

    def on_sandbox_closed(self, msg: SandboxClosed, sender: ActorAddress) -> None:
        for watched in self.sessions.values():
            if watched.close_under_way is not None and sender is not None \
                    and sender in (self.child(watched.runtime), watched.closer):
                self._closed(watched, [msg.session_id] if msg.session_id else [])
                return
        self.drop(msg, "no close under way waits for it from there")

    def _closed(self, watched: Watched, sessions: list[str]) -> None:
        watched.close_under_way, watched.closer = None, None
        if watched.end_waits:
            watched.end_waits = False
            self.to_controller(watched, SandboxClosed(request_id=END,
                                                      session_id=watched.session_id))
        self._shutdown_step(watched.session_id, sessions)
        if watched.standing_down:
            watched.standing_down = False
            if self.broker is not None:  # its history, kept for the next request
                self.send(self.broker, ForgetHistory(session_id=watched.session_id))
            self.forget_session(watched)
            self.send(self._parent_address, SteppedDown(session_id=watched.session_id))

    def _shutdown_step(self, session_id: str, closed: list[str]) -> None:
        """``session_id`` is done with (its sandbox closed, or it went): answer each
        shutdown that waited for nothing else."""
        for shutdown in list(self.shutdowns):
            if session_id in shutdown.waiting:
                shutdown.waiting.discard(session_id)
                shutdown.closed.extend(closed)
                if not shutdown.waiting:
                    self.shutdowns.remove(shutdown)
                    self.send(shutdown.reply_to, ShutdownDone(
                        request_id=shutdown.request_id, sessions=shutdown.closed))

    def forget_session(self, watched: Watched) -> None:
        """The session leaves the group: its children go (its sandbox stays as it is)."""
        self.stop_child(watched.controller)
        self.stop_child(watched.runtime)
        self.sessions.pop(watched.session_id, None)
        self._shutdown_step(watched.session_id, [])

    def closer_exited(self, address: ActorAddress) -> bool:
        """Whether ``address`` was a one-shot closer; one that died before it answered is
        answered for (nobody must wait for it for ever)."""
        for watched in self.sessions.values():
            if watched.closer is not None and address == watched.closer:
                logger.error("session %s: the proxy closing the sandbox exited before it "
                             "answered", watched.session_id)
                self._closed(watched, [])
                return True
        return False

    def runtime_lost(self, watched: Watched) -> None:
        """The live proxy died: a close it had under way is done by a one-shot one."""
        if watched.close_under_way is not None and watched.closer is None:
            request_id, watched.close_under_way = watched.close_under_way, None
            self.close_sandbox(watched, request_id)

    # -- a settled session stands down (``actors/root_sessions.py``) --------------------

    def on_standing_down(self, msg: StandingDown, sender: ActorAddress) -> None:
        """A Controller has been settled for ``settled_stand_down_s``: ask the root,
        unless a command is on its way to it or anything else is under way here."""
        watched = self.child_session(sender, CONTROLLER, msg)
        if watched is None:
            return
        quiet = (watched.handed == msg.relays and not watched.held and not watched.woken
                 and watched.recording is None and not watched.in_flight.relays
                 and watched.close_under_way is None
                 and not (self.shut or watched.standing_down))
        if not quiet:
            self.send(sender, StandDown(session_id=watched.session_id, go=False))
            return
        watched.standing_down = True
        self.send(self._parent_address, StandingDown(session_id=watched.session_id,
                                                     relays=watched.relays_seen))

    def on_stand_down(self, msg: StandDown, sender: ActorAddress) -> None:
        if not self.from_parent(msg, sender, "who supervises the session"):
            return
        watched = self.sessions.get(msg.session_id)
        if watched is None or not watched.standing_down:
            self.drop(msg, "that session asked for no stand-down")
            return
        if not msg.go:
            watched.standing_down = False
        controller = self.child(watched.controller)
        if controller is not None:
            self.send(controller, msg)  # go: the Controller looks once more
        elif msg.go:
            self.stay(watched)

    def on_stepped_down(self, msg: SteppedDown, sender: ActorAddress) -> None:
        watched = self.child_session(sender, CONTROLLER, msg)
        if watched is None:
            return
        if not watched.standing_down:
            self.drop(msg, "no stand-down of that session is under way")
        elif msg.stayed:
            self.stay(watched)
        else:
            logger.info("session %s: settled: closing its sandbox and standing down (the "
                        "next command restores it)", watched.session_id)
            self.close_sandbox(watched, STAND_DOWN)

    def stay(self, watched: Watched) -> None:
        """A stand-down the root said go to is off: the commands it holds come here."""
        if watched.standing_down:
            watched.standing_down = False
            self.send(self._parent_address, SteppedDown(session_id=watched.session_id,
                                                        stayed=True))
