"""SessionSupervisor: one per session; supervises its RuntimeProxy and Controller.

It restarts either child under the session's policy, tells the Controller when the
runtime went down and came back (so it can resolve in-flight actions from the journal),
and relays user commands to the Controller, holding them while it restarts.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from thespian.actors import ActorAddress

from ..messages.events import AgentState, StateChanged
from ..messages.protocol import CloseSandbox as CloseSandboxMsg
from ..messages.protocol import (
    Refused,
    RuntimeFailed,
    RuntimeReady,
    SandboxClosed,
    StartSession,
    StoreFault,
)
from ..paths import Home
from ..store import open_store
from ..supervision import ChildSpec, Supervisor
from .controller import Controller
from .runtime_proxy import RuntimeProxy
from .wiring import (
    BootController,
    BootRuntime,
    BootSession,
    BrokerMoved,
    Relay,
    RestartRuntime,
    Rewire,
    RuntimeGaveUp,
    Shutdown,
    ShutdownDone,
    Superseded,
)

logger = logging.getLogger(__name__)

RUNTIME, CONTROLLER = "runtime", "controller"
_last_epoch = 0


def next_epoch() -> int:
    """A sandbox epoch: increasing across proxy restarts and across reopened homes."""
    global _last_epoch
    _last_epoch = max(_last_epoch + 1, time.time_ns() // 1_000_000)
    return _last_epoch


class SessionSupervisor(Supervisor):
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
        self.shutdown: tuple[Shutdown, ActorAddress] | None = None
        self.first_reply: ActorAddress | None = None

    def on_boot_session(self, msg: BootSession, sender: ActorAddress) -> None:
        self.set_parent(sender)
        self.policy, self.start, self.broker = msg.policy, msg.start, msg.broker
        start = msg.start
        self.publish_pid(Home.at(start.home).actor_pid_path("session", start.session_id))
        runtime = self.supervise(ChildSpec(
            RUNTIME, self.runtime_class, lambda n: BootRuntime(start=start, epoch=next_epoch())))
        self.first_reply = msg.reply_to

        def boot_controller(n: int) -> BootController:
            reply_to = self.first_reply if n == 1 else None
            again = start if n == 1 else start.model_copy(update={"restore": True})
            return BootController(start=again, broker=self.broker,  # type: ignore[arg-type]
                                  runtime=self.child(RUNTIME), reply_to=reply_to)

        self.supervise(ChildSpec(CONTROLLER, self.controller_class, boot_controller))
        logger.info("session %s: supervisor up (runtime %s)", start.session_id, runtime)

    # -- runtime lifecycle ------------------------------------------------------------

    def _to_controller(self, msg: Any) -> None:
        controller = self.child(CONTROLLER)
        if controller is not None:
            self.send(controller, msg)

    def on_runtime_ready(self, msg: RuntimeReady, sender: ActorAddress) -> None:
        if sender != self.child(RUNTIME):
            return  # a stale proxy's report
        self.ready = msg
        self._to_controller(msg)

    def on_runtime_failed(self, msg: RuntimeFailed, sender: ActorAddress) -> None:
        self.ready = None
        self._to_controller(msg)

    def on_child_down(self, role: str, reason: str) -> None:
        # A proxy that reported its failure first already told the Controller; one killed
        # outright (or before it was ready) did not.
        if role == RUNTIME and self.start is not None and self.ready is not None:
            self.ready = None
            self._to_controller(RuntimeFailed(
                session_id=self.start.session_id, epoch=0, cause="exited", detail=reason))

    def on_child_restarted(
        self, role: str, address: ActorAddress, incarnation: int, reason: str
    ) -> None:
        if role == RUNTIME:
            self._to_controller(Rewire(runtime=address, reason=reason))
        elif role == CONTROLLER:
            if self.ready is not None:
                self.send(address, self.ready)
            self._release_held()

    def on_child_gave_up(self, role: str, reason: str, retry_in_s: float | None) -> None:
        what = "the sandbox" if role == RUNTIME else "the agent loop"
        text = (f"{what} failed {self.policy.intensity + 1} times within "
                f"{self.policy.period_s:g} s (last: {reason}); "
                + (f"trying again in {retry_in_s:g} s" if retry_in_s is not None
                   else "resume to try again"))
        resumes_at = (datetime.now(UTC) + timedelta(seconds=retry_in_s)
                      if retry_in_s is not None else None)
        if role == RUNTIME:
            self._to_controller(RuntimeGaveUp(reason=text, resumes_at=resumes_at))
        else:
            self._controller_gave_up(text, resumes_at)

    def _controller_gave_up(self, text: str, resumes_at: datetime | None) -> None:
        """Nobody drives the session now: record ERROR for it and answer who waits."""
        assert self.start is not None
        session_id = self.start.session_id
        logger.error("session %s: %s", session_id, text)
        store = open_store(Home.at(self.start.home))
        try:
            store.append(session_id, [StateChanged(state=AgentState.ERROR, reason=text,
                                                   resumes_at=resumes_at)],
                         owner=store.claim_owner(session_id))
        finally:
            store.close()
        waiting = [(self.first_reply, self.start.request_id)]
        waiting += [(h.reply_to, getattr(h.msg, "request_id", "")) for h in self.held]
        self.held, self.first_reply = [], None
        for reply_to, request_id in waiting:
            if reply_to is not None:
                self.send(reply_to, Refused(request_id=request_id, session_id=session_id,
                                            error="InvalidRequest", message=text))
        if resumes_at is None:
            self.send(self._parent_address, Superseded(session_id=session_id, reason=text))

    def on_store_fault(self, msg: StoreFault, sender: ActorAddress) -> None:
        self.send(self._parent_address, msg)  # the root answers the program's queries

    def on_restart_runtime(self, msg: RestartRuntime, sender: ActorAddress) -> None:
        self.restart_child(RUNTIME, msg.reason)

    def on_superseded(self, msg: Superseded, sender: ActorAddress) -> None:
        """Another Trouper restored this session and owns its log now: stand down."""
        if sender not in (self.child(CONTROLLER), self.child(RUNTIME)):
            return  # a replaced incarnation of our own: its successor is in charge
        logger.warning("session %s: %s; standing down", msg.session_id, msg.reason)
        self.stop_child(CONTROLLER)
        self.stop_child(RUNTIME)  # the sandbox stays: the new owner uses it
        self.send(self._parent_address, msg)

    # -- relays --------------------------------------------------------------------

    def on_relay(self, msg: Relay, sender: ActorAddress) -> None:
        if self.child(CONTROLLER) is None:
            self.held.append(msg)
            return
        self._to_controller(msg)

    def _release_held(self) -> None:
        held, self.held = self.held, []
        for msg in held:
            self._to_controller(msg)

    def on_broker_moved(self, msg: BrokerMoved, sender: ActorAddress) -> None:
        self.broker = msg.broker
        self._to_controller(Rewire(broker=msg.broker, reason="the LLM broker restarted"))

    # -- shutdown --------------------------------------------------------------------

    def on_shutdown(self, msg: Shutdown, sender: ActorAddress) -> None:
        runtime = self.child(RUNTIME)
        if not msg.stop_sandboxes or runtime is None:
            self.send(sender, ShutdownDone(request_id=msg.request_id))
            return
        self.shutdown = (msg, sender)
        self.send(runtime, CloseSandboxMsg(request_id=msg.request_id))

    def on_sandbox_closed(self, msg: SandboxClosed, sender: ActorAddress) -> None:
        if self.shutdown is not None:
            request, reply_to = self.shutdown
            self.send(reply_to, ShutdownDone(request_id=request.request_id,
                                             sessions=[msg.session_id]))
            self.shutdown = None
