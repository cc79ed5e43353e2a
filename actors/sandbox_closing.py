"""What a SessionSupervisor does to close its session's sandbox.

Three things close it: the session stopping (``EndSandbox`` from the Controller,
answered ``SandboxClosed`` once the sandbox is ended), the tree shutting down
(``Shutdown``, answered ``ShutdownDone``) and a settled session standing down
(``SteppedDown`` to the root once closed, ``actors/root_sessions.py``). One close runs
at a time and answers every request waiting for it. The live RuntimeProxy does it; when
none is live (restarting after a crash, given up on past the restart intensity, killed
during the close) a one-shot proxy does (``CloseFor``): before, a shutdown that found
the proxy down was answered at once and the sandbox left (a container killed under a
busy run stayed ``Exited`` after the program's close), and a restart timer firing after
the shutdown started a fresh one.

Once the sandbox is ended no proxy starts until the Controller asks (``RestartRuntime``,
the session going on), and after a shutdown none starts at all.
"""

from __future__ import annotations

import logging
from typing import Any

from thespian.actors import ActorAddress

from ..messages.protocol import CloseSandbox, SandboxClosed, StartSession
from ..messages.tree import (
    CloseFor,
    EndSandbox,
    ForgetHistory,
    Shutdown,
    ShutdownDone,
    SteppedDown,
)
from ..supervisor import Supervisor

logger = logging.getLogger(__name__)

RUNTIME, CONTROLLER = "runtime", "controller"
END = "end"
"""The request id of the close an end makes."""
STAND_DOWN = "stand-down"
"""The request id of the close a settled session's stand-down makes."""


class SandboxClosing(Supervisor):
    """The sandbox closes of a session (mixed into ``SessionSupervisor``)."""

    runtime_class: type
    start: StartSession | None
    session_id: str
    broker: ActorAddress | None

    def __init__(self) -> None:
        super().__init__()
        self.closing: list[tuple[Shutdown, ActorAddress]] = []
        """Shutdowns waiting for the sandbox to close; each is answered once."""
        self.end_waits = False
        """The Controller waits for the sandbox's end (``SandboxClosed``)."""
        self.ended = False
        """The sandbox was ended: no proxy starts until the Controller asks again."""
        self.shut = False
        """A shutdown came: nothing starts again."""
        self.close_under_way = False
        self.closer: ActorAddress | None = None
        """A one-shot proxy closing the sandbox while the session's proxy is down."""
        self.standing_down = False
        """The session stands down: once the sandbox is closed, the root stops it."""

    def may_restart(self, role: str) -> bool:
        return not self.shut and not (role == RUNTIME and self.ended)

    def _to_controller(self, msg: Any) -> None:
        controller = self.child(CONTROLLER)
        if controller is not None:
            self.send(controller, msg)

    def on_end_sandbox(self, msg: EndSandbox, sender: ActorAddress) -> None:
        if sender is None or sender != self.child(CONTROLLER):
            self.drop(msg, "not from its current controller")
            return
        logger.info("session %s: ending its sandbox (%s)", self.session_id, msg.reason)
        self.ended, self.end_waits = True, True
        self.runtime_ended()
        self._close_sandbox(END)

    def runtime_ended(self) -> None:
        """The sandbox is being ended: it is not ready for anyone now."""

    def on_shutdown(self, msg: Shutdown, sender: ActorAddress) -> None:
        self.shut = self.start is not None  # (one not booted yet has nothing to close)
        if not msg.stop_sandboxes or self.start is None:
            self.send(sender, ShutdownDone(request_id=msg.request_id))
            return
        self.closing.append((msg, sender))
        self._close_sandbox(msg.request_id)

    def _close_sandbox(self, request_id: str) -> None:
        """Close the sandbox: through the live proxy, or a one-shot one when it is down;
        a close under way answers whoever waits when it is done."""
        if self.close_under_way:
            return
        self.close_under_way = True
        runtime = self.child(RUNTIME)
        if runtime is not None:
            self.send(runtime, CloseSandbox(request_id=request_id))
            return
        assert self.start is not None
        self.closer = self.start_helper(self.runtime_class,
                                        CloseFor(start=self.start, request_id=request_id))

    def on_sandbox_closed(self, msg: SandboxClosed, sender: ActorAddress) -> None:
        if not self.close_under_way or sender is None \
                or sender not in (self.child(RUNTIME), self.closer):
            self.drop(msg, "no close under way waits for it from there")
            return
        self._closed([msg.session_id] if msg.session_id else [])  # "": none was running

    def _closed(self, sessions: list[str]) -> None:
        self.close_under_way, self.closer = False, None
        if self.end_waits:
            self.end_waits = False
            self._to_controller(SandboxClosed(request_id=END, session_id=self.session_id))
        closing, self.closing = self.closing, []
        for request, reply_to in closing:
            self.send(reply_to, ShutdownDone(request_id=request.request_id, sessions=sessions))
        if self.standing_down:
            self.standing_down = False
            if self.broker is not None:  # its history, kept for the next request
                self.send(self.broker, ForgetHistory(session_id=self.session_id))
            self.send(self._parent_address, SteppedDown(session_id=self.session_id))

    def closer_exited(self, address: ActorAddress) -> bool:
        """Whether ``address`` was the one-shot closer; one that died before it answered
        is answered for (nobody must wait for it for ever)."""
        if self.closer is None or address != self.closer:
            return False
        logger.error("session %s: the proxy closing the sandbox exited before it answered",
                     self.session_id)
        self._closed([])
        return True

    def runtime_lost(self) -> None:
        """The live proxy died: a close it had under way is done by a one-shot one."""
        if self.close_under_way and self.closer is None:
            self.close_under_way = False
            self._close_sandbox(END)
