"""SessionSupervisor: one per session; supervises its RuntimeProxy and Controller.

It restarts either child under the session's policy, tells the Controller when the
runtime went down and came back (so it can resolve in-flight actions from the journal),
and relays user commands to the Controller, holding them while it restarts.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from thespian.actors import ActorAddress

from ..messages.protocol import CloseSandbox as CloseSandboxMsg
from ..messages.protocol import (
    RuntimeFailed,
    RuntimeReady,
    SandboxClosed,
    StartSession,
)
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

    def __init__(self) -> None:
        super().__init__()
        self.start: StartSession | None = None
        self.broker: ActorAddress | None = None
        self.ready: RuntimeReady | None = None
        self.held: list[Relay] = []
        self.shutdown: tuple[Shutdown, ActorAddress] | None = None

    def on_boot_session(self, msg: BootSession, sender: ActorAddress) -> None:
        self.set_parent(sender)
        self.policy, self.start, self.broker = msg.policy, msg.start, msg.broker
        start = msg.start
        runtime = self.supervise(ChildSpec(
            RUNTIME, RuntimeProxy, lambda n: BootRuntime(start=start, epoch=next_epoch())))
        first_reply = [msg.reply_to]

        def boot_controller(n: int) -> BootController:
            reply_to, first_reply[0] = first_reply[0], None
            again = start if n == 1 else start.model_copy(update={"restore": True})
            return BootController(start=again, broker=self.broker,  # type: ignore[arg-type]
                                  runtime=self.child(RUNTIME), reply_to=reply_to)

        self.supervise(ChildSpec(CONTROLLER, Controller, boot_controller))
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
        if role == RUNTIME and self.start is not None:
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

    def on_child_gave_up(self, role: str, reason: str) -> None:
        tries = self.policy.intensity
        if role == RUNTIME:
            self._to_controller(RuntimeGaveUp(
                reason=f"the sandbox failed {tries + 1} times within {self.policy.period_s:g} s "
                f"(last: {reason})"))
        else:
            logger.error("session %s: %s gave up after %d restarts: %s",
                         self.start.session_id if self.start else "?", role, tries, reason)

    def on_restart_runtime(self, msg: RestartRuntime, sender: ActorAddress) -> None:
        self.restart_child(RUNTIME, msg.reason)

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
