"""RuntimeProxy: owns one session's sandbox backend; never blocks its handler.

The rules are ``runtimes/driver.py``'s ``RuntimeDriver`` (no Thespian, unit-tested with a
fake backend); this actor boots it, hands it each input and performs the effects it
returns. Lifecycle reports (``RuntimeReady``, ``RuntimeFailed``) go to the parent
SessionSupervisor; ``Executed`` and ``Resolved`` answer whoever asked (the Controller).
"""

from __future__ import annotations

import logging

from thespian.actors import ActorAddress, ActorExitRequest

from ..home.paths import Home
from ..messages.protocol import CloseSandbox, Execute, ResolveAction, SandboxClosed
from ..messages.tree import BootRuntime, CloseFor
from ..observability import tracing
from ..runtimes.driver import After, Drop, Effect, Exit, Reply, RuntimeDriver, ToParent, Work
from ..runtimes.session_sandbox import session_sandbox
from ..security.masking import mask_known, remember_secrets, session_maskers
from .base import Timer, TrouperActor

logger = logging.getLogger(__name__)


class RuntimeProxy(TrouperActor):
    role = "runtime"

    def __init__(self) -> None:
        super().__init__()
        self.driver: RuntimeDriver | None = None
        self._early: list[tuple[Execute | ResolveAction, ActorAddress]] = []
        """Requests that came before the boot: handed to the driver once it exists."""
        self.closing_only = False
        """A one-shot closer (``CloseFor``): it exits once the sandbox is stopped."""

    @property
    def session_id(self) -> str:
        return self.driver.session_id if self.driver is not None else ""

    # -- inputs ----------------------------------------------------------------

    def on_boot_runtime(self, msg: BootRuntime, sender: ActorAddress) -> None:
        self.set_parent(sender)
        start = msg.start
        # the sandbox's errors may quote a command or its output: mask reports and logs
        remember_secrets(session_maskers(start.secrets, start.config.llm,
                                        start.config.runtime)[0].pairs)
        home = Home.at(start.home)
        self.publish_pid(home.actor_pid_path("runtime", start.session_id))
        sandbox = session_sandbox(start)
        if hasattr(sandbox, "progress"):  # a backend that reports the steps of its start
            sandbox.progress = self._progress_from_worker  # type: ignore[attr-defined]
        self.driver = RuntimeDriver(start.session_id, sandbox,
                                    runtime_kind=start.config.runtime.kind)
        self.perform(self.driver.start())
        early, self._early = self._early, []
        for request, requester in early:
            self.perform(self.driver.handle(request, requester))

    def on_close_for(self, msg: CloseFor, sender: ActorAddress) -> None:
        """A one-shot closer's whole life: the session's proxy is down and its sandbox is
        to close. Stop it (a backend stops what runs without having started it), answer
        ``SandboxClosed``, exit."""
        self.set_parent(sender)
        start = msg.start
        remember_secrets(session_maskers(start.secrets, start.config.llm,
                                        start.config.runtime)[0].pairs)
        self._stopping, self.closing_only = True, True
        self.driver = RuntimeDriver(start.session_id, session_sandbox(start))
        self.perform(self.driver.close(CloseSandbox(request_id=msg.request_id), sender))

    def _progress_from_worker(self, phase: str, detail: str) -> None:
        """Called on the worker thread that starts the sandbox: hand it to the actor."""
        self.background.submit(lambda: (phase, detail), self._progressed)

    def _progressed(self, step: tuple[str, str] | None, error: BaseException | None) -> None:
        if step is not None and self.driver is not None and not self._stopping:
            self.perform(self.driver.progressed(*step))

    def on_execute(self, msg: Execute, sender: ActorAddress) -> None:
        self._request(msg, sender)

    def on_resolve_action(self, msg: ResolveAction, sender: ActorAddress) -> None:
        self._request(msg, sender)

    def _request(self, msg: Execute | ResolveAction, sender: ActorAddress) -> None:
        if self.driver is not None:
            self.perform(self.driver.handle(msg, sender))
        elif self._stopping:
            self.drop(msg, "the proxy is closing or exiting; nothing more starts here")
        else:
            self._early.append((msg, sender))  # before the boot

    def on_close_sandbox(self, msg: CloseSandbox, sender: ActorAddress) -> None:
        self._stopping = True
        if self.driver is None:  # not booted: nothing was started, nothing to stop
            self.send(sender, SandboxClosed(request_id=msg.request_id, session_id=""))
            return
        self.perform(self.driver.close(msg, sender))

    def on_timer_health(self, token: object) -> None:
        if self.driver is None:
            self.drop(Timer("health", token), "the proxy is stopping")
            return
        self.perform(self.driver.health_due(Timer("health", token)))

    def on_timer_execute_again(self, token: tuple[Execute, ActorAddress]) -> None:
        msg, sender = token
        self._request(msg, sender)  # safe: an action the journal refused never started

    def watched_fds(self) -> list[int]:
        return [] if self.driver is None else self.driver.watched_fds()

    def on_fd_ready(self, fd: int) -> None:
        """The server exited (closed here, on the actor's thread: Thespian gets the list
        without it next)."""
        if self.driver is not None:
            self.perform(self.driver.exited(fd))

    def on_exit_request(self, msg: ActorExitRequest, sender: ActorAddress) -> None:
        if self.driver is not None:
            self.driver.stopping = True
        tracing.flush_at_exit()  # now: once its parent hears it is gone, it may be killed

    # -- effects ---------------------------------------------------------------

    def perform(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, ToParent):
                self.send(self._parent_address, effect.msg)
            elif isinstance(effect, Reply):
                self.send(effect.to, effect.msg)
                if self.closing_only and isinstance(effect.msg, SandboxClosed):
                    self.send(self.myAddress, ActorExitRequest())  # its work is done
            elif isinstance(effect, Work):
                then = effect.then
                self.background.submit(effect.fn,
                                       lambda result, error, then=then: self.perform(
                                           then(result, error)))
            elif isinstance(effect, After):
                self.after(effect.delay_s, effect.name, effect.token)
            elif isinstance(effect, Exit):
                self.fail(effect.reason, effect.error)
            elif isinstance(effect, Drop):
                self.drop(effect.msg, effect.why, effect.level)

    def fail(self, reason: str, exc: BaseException | None = None, tb: str = "") -> None:
        """Exit on purpose; the reason and traceback go to the supervisor masked."""
        if self.driver is not None:
            self.driver.stopping = True
        super().fail(mask_known(reason), exc, mask_known(tb))
