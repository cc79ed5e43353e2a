"""RuntimeProxy: owns one session's sandbox backend; never blocks its handler.

Lifecycle reports (``RuntimeReady``, ``RuntimeFailed``) go to the parent SessionSupervisor;
``Executed`` and ``Resolved`` answer whoever asked (the Controller). Each incarnation
carries an epoch; a sandbox that serves a newer epoch refuses this one, and the proxy
then exits (a half-dead proxy never acts after its replacement started: promise I2).

Once it is told to close it starts nothing more: an ``Execute`` after ``CloseSandbox`` is
dropped (the journal will say it never started, so a restored session runs it then), and a
close that arrives while the sandbox is starting waits for the start, so what the start
brings up is stopped too. An action for another session is dropped, never run here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from thespian.actors import ActorAddress

from ..exceptions import RuntimeUnavailable, StaleEpoch, StoreUnavailable, class_path
from ..masking import mask_known, remember_secrets, session_maskers
from ..messages.protocol import (
    CloseSandbox,
    Execute,
    Executed,
    JournalFault,
    ResolveAction,
    Resolved,
    RuntimeFailed,
    RuntimeFailure,
    RuntimeProgress,
    RuntimeReady,
    SandboxClosed,
)
from ..messages.tree import BootRuntime, Superseded
from ..paths import Home
from ..processes import exit_watch
from ..runtimes import load_sandbox
from ..runtimes.base import JournalRecord, Sandbox, SandboxHealth
from ..settings import settings
from .base import Timer, TrouperActor

logger = logging.getLogger(__name__)



class RuntimeProxy(TrouperActor):
    role = "runtime"

    def __init__(self) -> None:
        super().__init__()
        self._sandbox: Sandbox | None = None
        self._session_id = ""
        self._epoch = 0
        self._ready = False
        self._waiting: list[tuple[Any, ActorAddress]] = []
        self._starting = False
        self._closes: list[tuple[CloseSandbox, ActorAddress]] = []
        """CloseSandbox requests not answered yet: all are answered when the stop is done."""
        self._exit_fd: int | None = None
        """A pidfd of the sandbox server, readable once it exits (None: not watched)."""
        self._blocked: dict[str, float] = {}
        """Actions the sandbox could not journal, with the wait before the next try."""

    @property
    def session_id(self) -> str:
        return self._session_id

    # -- lifecycle -------------------------------------------------------------

    def on_boot_runtime(self, msg: BootRuntime, sender: ActorAddress) -> None:
        self.set_parent(sender)
        start = msg.start
        self._session_id = start.session_id
        # the sandbox's errors may quote a command or its output: mask reports and logs
        remember_secrets(session_maskers(start.secrets, start.config.llm,
                                        start.config.runtime)[0].pairs)
        home = Home.at(start.home)
        self.publish_pid(home.actor_pid_path("runtime", start.session_id))
        self._sandbox = load_sandbox(
            start.config.runtime,
            session_id=start.session_id,
            workspace=Path(start.config.workspace),
            state_dir=home.runtime_dir(start.session_id),
            env=dict(start.secrets),
            secret_names=tuple(sorted(start.secrets)),  # the sandbox masks their values
            max_output_chars=start.config.max_output_chars,
        )
        sandbox = self._sandbox
        if hasattr(sandbox, "progress"):  # a backend that reports the steps of its start
            sandbox.progress = self._progress_from_worker  # type: ignore[attr-defined]
        self._starting = True  # the sandbox counts the epoch: a stepped clock cannot fence us
        self.background.submit(sandbox.start, self._started)

    def _progress_from_worker(self, phase: str, detail: str) -> None:
        """Called on the worker thread that starts the sandbox: hand it to the actor."""
        self.background.submit(lambda: (phase, detail), self._progressed)

    def _progressed(self, step: tuple[str, str] | None, error: BaseException | None) -> None:
        if step is None or self._stopping:
            return
        phase, detail = step
        detail = mask_known(detail)
        logger.info("session %s: sandbox start: %s: %s", self._session_id, phase, detail)
        self.send(self._parent_address, RuntimeProgress(
            session_id=self._session_id, phase=phase, detail=detail))

    def _health_every_s(self) -> float:
        """The health period: the settings', slower while the sandbox's exit is watched,
        or the backend's when it asks for less (a container's death is cheap to see and
        should be seen within a second)."""
        wanted = getattr(self._sandbox, "health_every_s", None)
        every = settings().sandbox_health_every_s
        if self._exit_fd is not None:  # often enough that the server never idles out
            idle_s = getattr(self._sandbox, "idle_timeout_s", None) or float("inf")
            every = min(settings().sandbox_watched_health_every_s, idle_s / 3)
        return min(every, wanted) if isinstance(wanted, (int, float)) and wanted > 0 else every

    def _watch_exit(self) -> None:
        """Wait on the sandbox server's exit (a pidfd Thespian selects on) where the
        backend runs one here, rather than asking it every few seconds whether it lives."""
        server_pid = getattr(self._sandbox, "server_pid", None)
        pid = server_pid() if callable(server_pid) else None
        if self._exit_fd is not None:  # a start again in this incarnation: the old server's
            os.close(self._exit_fd)
        self._exit_fd = exit_watch(pid) if pid else None

    def watched_fds(self) -> list[int]:
        return [] if self._exit_fd is None else [self._exit_fd]

    def on_fd_ready(self, fd: int) -> None:
        """The server exited: stop watching, and let a health check say how it ended."""
        os.close(fd)  # here, on the actor's thread: Thespian gets the list without it next
        self._exit_fd = None
        if self._sandbox is not None and not self._stopping:
            self.background.submit(self._sandbox.alive, self._health_checked)

    def _started(self, attached: bool | None, error: BaseException | None) -> None:
        self._starting = False
        if self._stopping:  # told to close meanwhile: stop what the start brought up
            for waiting, _sender in self._waiting:
                self.drop(waiting, "the sandbox closed before it was ready")
            self._waiting = []
            self._close_now()
            return
        if error is not None:
            self._report_failure(RuntimeFailure.START_FAILED, error)
            return
        self._ready = True
        self._epoch = self._sandbox.epoch or 0 if self._sandbox is not None else 0
        self.send(self._parent_address, RuntimeReady(
            session_id=self._session_id, epoch=self._epoch, attached=bool(attached)))
        waiting, self._waiting = self._waiting, []
        for msg, sender in waiting:
            self._dispatch_own(msg, sender)
        self._watch_exit()
        self.after(self._health_every_s(), "health")

    def on_timer_health(self, token: object) -> None:
        sandbox = self._sandbox
        if sandbox is None or self._stopping:
            self.drop(Timer("health", token), "the proxy is stopping")
            return
        self.background.submit(sandbox.alive, self._health_checked)

    def _health_checked(self, health: SandboxHealth | None, error: BaseException | None) -> None:
        if error is not None or health is None or not health.alive:
            cause = (health.cause if health is not None else None) or RuntimeFailure.UNREACHABLE
            detail = health.detail if health is not None else str(error)
            self._report_failure(cause, error, detail)
            return
        self.after(self._health_every_s(), "health")

    def _report_failure(self, cause: RuntimeFailure, error: BaseException | None,
                        detail: str = "") -> None:
        """Tell the supervisor what failed, then exit so it restarts a clean proxy. Once:
        a dead server is seen by its exit watch and by the request it broke alike."""
        if self._stopping:
            return
        if isinstance(error, StaleEpoch) or cause == RuntimeFailure.SUPERSEDED:
            # Another proxy owns the sandbox: if it is not our supervisor's, another
            # Trouper restored this session; the supervisor decides (it checks the sender).
            self.send(self._parent_address, Superseded(
                session_id=self._session_id, reason=mask_known(
                    f"the sandbox serves a newer proxy: {detail or error}")))
            self.fail(f"superseded by a newer runtime proxy: {detail or error}", error)
            return
        text = mask_known(detail or (f"{type(error).__name__}: {error}" if error else cause))
        self.send(self._parent_address, RuntimeFailed(
            session_id=self._session_id, epoch=self._epoch, cause=cause, detail=text,
            error_class=class_path(error) if error else ""))
        self.fail(f"sandbox {cause}: {text}", error)

    def _failed_with_health(self, error: BaseException) -> None:
        """A request failed: report the sandbox's own cause when it is dead (an OOM kill
        says more than the refused connection it led to), else the request's."""
        sandbox = self._sandbox
        if sandbox is None or isinstance(error, StaleEpoch):
            self._report_failure(_cause(error), error)
            return

        def checked(health: SandboxHealth | None, _error: BaseException | None) -> None:
            if health is not None and not health.alive and health.cause is not None:
                self._report_failure(health.cause, error, health.detail)
            else:
                self._report_failure(_cause(error), error)

        self.background.submit(sandbox.alive, checked)

    def fail(self, reason: str, exc: BaseException | None = None, tb: str = "") -> None:
        """Exit on purpose; the reason and traceback go to the supervisor masked."""
        super().fail(mask_known(reason), exc, mask_known(tb))

    def on_close_sandbox(self, msg: CloseSandbox, sender: ActorAddress) -> None:
        self._stopping = True
        self._closes.append((msg, sender))
        if self._starting:  # a start waiting for an unreachable server would hold the close
            cancel = getattr(self._sandbox, "cancel", None)
            if callable(cancel):
                cancel()
        if self._starting or len(self._closes) > 1:
            return  # answered when the start, or the stop under way, is done
        self._close_now()

    def _close_now(self) -> None:
        """Stop the sandbox (idempotent) and answer every close waiting for it."""
        sandbox = self._sandbox
        if sandbox is None:
            self._closed(None, None)
            return
        self.background.submit(sandbox.stop, self._closed)

    def _closed(self, _result: object, error: BaseException | None) -> None:
        if error is not None:
            logger.warning("session %s: the sandbox did not stop cleanly: %s",
                           self._session_id, mask_known(str(error)))
        closes, self._closes = self._closes, []
        for msg, sender in closes:
            self.send(sender, SandboxClosed(request_id=msg.request_id,
                                            session_id=self._session_id))

    # -- actions ---------------------------------------------------------------

    def _defer(self, msg: Execute | ResolveAction, sender: ActorAddress) -> bool:
        """True when ``msg`` is not for now: dropped, or held until the sandbox is ready."""
        if self._stopping:
            self.drop(msg, "the proxy is closing or exiting; nothing more starts here")
            return True
        if msg.session_id != self._session_id and self._sandbox is not None:
            self.drop(msg, "not for this session's sandbox", logging.WARNING)
            return True
        if self._ready:
            return False
        self._waiting.append((msg, sender))  # before the boot, or while the sandbox starts
        return True

    def on_execute(self, msg: Execute, sender: ActorAddress) -> None:
        if self._defer(msg, sender) or self._sandbox is None:
            return
        runtime = self._sandbox.runtime

        def work() -> Any:
            return runtime.execute(
                msg.action_id, msg.action,
                timeout_s=msg.timeout_s, no_output_timeout_s=msg.no_output_timeout_s)

        def done(outcome: Any, error: BaseException | None) -> None:
            if isinstance(error, StoreUnavailable):  # not run: try it again, say why once
                self._journal_blocked(msg, sender, error)
                return
            if error is not None:
                # The action's fate is in the journal; the Controller resolves it from there.
                self._failed_with_health(error)
                return
            if self._blocked.pop(msg.action_id, None) is not None:
                self.send(sender, JournalFault(session_id=self._session_id,
                                               action_id=msg.action_id, cause=None))
            self.send(sender, Executed(
                session_id=self._session_id, action_id=msg.action_id, outcome=outcome))

        self.background.submit(work, done)

    def _journal_blocked(self, msg: Execute, sender: ActorAddress,
                         error: StoreUnavailable) -> None:
        delay_s = self._blocked.get(msg.action_id)
        if delay_s is None:
            self.send(sender, JournalFault(session_id=self._session_id,
                                           action_id=msg.action_id, cause=error.cause))
        delay_s = min(settings().journal_retry_max_s,
                      (delay_s or settings().journal_retry_first_s / 2) * 2)
        self._blocked[msg.action_id] = delay_s
        self.after(delay_s, "execute_again", (msg, sender))

    def on_timer_execute_again(self, token: tuple[Execute, ActorAddress]) -> None:
        msg, sender = token
        self.on_execute(msg, sender)  # safe: an action the journal refused never started

    def on_resolve_action(self, msg: ResolveAction, sender: ActorAddress) -> None:
        if self._defer(msg, sender) or self._sandbox is None:
            return
        runtime = self._sandbox.runtime

        def done(record: JournalRecord | None, error: BaseException | None) -> None:
            if error is not None or record is None:
                self._report_failure(_cause(error), error)
                return
            if record.state == "running":
                self.on_resolve_action(msg, sender)  # still going: ask again (bounded waits)
                return
            self.send(sender, Resolved(
                session_id=self._session_id, action_id=msg.action_id,
                state=record.state, outcome=record.outcome))

        self.background.submit(
            lambda: runtime.resolve(msg.action_id, wait_s=settings().journal_resolve_wait_s), done)




def _cause(error: BaseException | None) -> RuntimeFailure:
    cause = getattr(error, "cause", None)
    if isinstance(cause, RuntimeFailure):  # a backend that knows why (remote: unauthorized)
        return cause
    if isinstance(error, RuntimeUnavailable):
        return RuntimeFailure.UNREACHABLE
    return RuntimeFailure.FAILED
