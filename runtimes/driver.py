"""One session's sandbox, driven without Thespian: what the RuntimeProxy decides.

``RuntimeDriver`` owns the sandbox backend's lifecycle and its actions and returns, for
each input, the effects to perform: reports to the supervisor (``ToParent``), answers to
whoever asked (``Reply``), blocking work for a worker thread whose result comes back to
the callback it names (``Work``), timers (``After``), an exit on purpose (``Exit``) and
inputs it cannot use (``Drop``). It never blocks: the backend's blocking calls (start,
alive, execute, resolve, stop) are ``Work``; only cheap ones run on the caller's thread
(the server's pid for the exit watch, cancelling a start). It imports no Thespian, so its
rules are unit-tested with a fake backend; the RuntimeProxy actor
(``actors/runtime_proxy.py``) performs the effects.

A start that fails because the sandbox cannot work as configured (``RuntimeMisconfigured``:
an image that is missing or has no ``sh``, a refused token, an unusable workspace) is
reported with the cause ``misconfigured`` and the driver does not exit: its supervisor
restarts only what exited, so nothing tries it again until the user resumes.

Each incarnation carries an epoch; a sandbox that serves a newer epoch refuses this one,
and the driver then exits (a half-dead proxy never acts after its replacement started:
I2 in docs/promises.md). Once it is told to close it starts nothing more: an ``Execute`` after
``CloseSandbox`` is dropped (the journal will say it never started, so a restored session
runs it then), and a close that arrives while the sandbox is starting waits for the
start, so what the start brings up is stopped too. An action for another session is
dropped, never run here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config.settings import settings
from ..exceptions import StaleEpoch, StoreUnavailable, class_path
from ..host.processes import exit_watch
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
from ..messages.tree import Superseded
from ..observability import tracing
from ..security.masking import mask_known
from .base import JournalRecord, Sandbox, SandboxHealth
from .call_failures import cause_of

logger = logging.getLogger(__name__)

Done = Callable[[Any, BaseException | None], list["Effect"]]
"""What a worker's result (or its error) is handed to: it returns the next effects."""


@dataclass
class ToParent:
    """Report to the supervisor."""

    msg: Any


@dataclass
class Reply:
    """Answer ``to`` (whoever sent the request; opaque to the driver)."""

    to: Any
    msg: Any


@dataclass
class Work:
    """Run ``fn`` on a worker thread; hand its result or error to ``then``."""

    fn: Callable[[], Any]
    then: Done


@dataclass
class After:
    """Give ``name``'s timer input (``RuntimeDriver.on_timer``) ``token`` after ``delay_s``."""

    delay_s: float
    name: str
    token: Any = None


@dataclass
class Exit:
    """Exit on purpose (the supervisor restarts a clean incarnation); said masked."""

    reason: str
    error: BaseException | None = None


@dataclass
class Drop:
    """An input the driver cannot use, logged in one line."""

    msg: Any
    why: str
    level: int = logging.INFO


Effect = ToParent | Reply | Work | After | Exit | Drop


@dataclass
class RuntimeDriver:
    """The rules of one session's sandbox (see the module doc)."""

    session_id: str
    sandbox: Sandbox
    epoch: int = 0
    ready: bool = False
    starting: bool = False
    stopping: bool = False
    """Closing or exiting: nothing more starts here."""
    exit_fd: int | None = None
    """A pidfd of the sandbox server, readable once it exits (None: not watched)."""
    waiting: list[tuple[Any, Any]] = field(default_factory=list)
    """Requests (and who sent them) held until the sandbox is ready."""
    closes: list[tuple[CloseSandbox, Any]] = field(default_factory=list)
    """CloseSandbox requests not answered yet: all are answered when the stop is done
    and every request in flight has come back."""
    in_flight: int = 0
    """Executes and resolves on a worker: what they bring back (an action's outcome, the
    one a stop gave it included) is answered before a close is."""
    stopped: bool = False
    """The last stop is done (the closes wait for ``in_flight`` alone)."""
    blocked: dict[str, float] = field(default_factory=dict)
    """Actions the sandbox could not journal, with the wait before the next try."""
    runtime_kind: str = ""
    """The session's runtime kind (``local``, ``docker``, ``remote``): its actions' spans say it."""

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> list[Effect]:
        """Start (or attach to) the sandbox; the sandbox counts the epoch itself, so a
        stepped clock cannot fence this incarnation."""
        self.starting = True
        return [Work(self.sandbox.start, self._started)]

    def progressed(self, phase: str, detail: str) -> list[Effect]:
        """A step of the sandbox's start (reported by the backend's worker thread)."""
        if self.stopping:
            return []
        detail = mask_known(detail)
        logger.info("session %s: sandbox start: %s: %s", self.session_id, phase, detail)
        return [ToParent(RuntimeProgress(session_id=self.session_id, phase=phase,
                                         detail=detail))]

    def _started(self, attached: bool | None, error: BaseException | None) -> list[Effect]:
        self.starting = False
        if self.stopping:  # told to close meanwhile: stop what the start brought up
            out: list[Effect] = [Drop(msg, "the sandbox closed before it was ready")
                                 for msg, _sender in self.waiting]
            self.waiting = []
            return out + self._close_now()
        if error is not None:
            misconfigured = cause_of(error) == RuntimeFailure.MISCONFIGURED
            return self._report_failure(RuntimeFailure.MISCONFIGURED if misconfigured
                                        else RuntimeFailure.START_FAILED, error)
        self.ready = True
        self.epoch = self.sandbox.epoch or 0
        out = [ToParent(RuntimeReady(session_id=self.session_id, epoch=self.epoch,
                                     attached=bool(attached)))]
        waiting, self.waiting = self.waiting, []
        for msg, sender in waiting:
            out += self.handle(msg, sender)
        self._watch_exit()
        out.append(After(self.health_every_s(), "health"))
        return out

    def health_every_s(self) -> float:
        """The health period: the settings', slower while the sandbox's exit is watched,
        or the backend's when it asks for less (a container's death is cheap to see and
        should be seen within a second)."""
        wanted = getattr(self.sandbox, "health_every_s", None)
        every = settings().sandbox_health_every_s
        if self.exit_fd is not None:  # often enough that the server never idles out
            idle_s = getattr(self.sandbox, "idle_timeout_s", None) or float("inf")
            every = min(settings().sandbox_watched_health_every_s, idle_s / 3)
        return min(every, wanted) if isinstance(wanted, (int, float)) and wanted > 0 else every

    def _watch_exit(self) -> None:
        """Wait on the sandbox server's exit (a pidfd the actor selects on) where the
        backend runs one here, rather than asking it every few seconds whether it lives."""
        server_pid = getattr(self.sandbox, "server_pid", None)
        pid = server_pid() if callable(server_pid) else None
        if self.exit_fd is not None:  # a start again in this incarnation: the old server's
            os.close(self.exit_fd)
        self.exit_fd = exit_watch(pid) if pid else None

    def watched_fds(self) -> list[int]:
        return [] if self.exit_fd is None else [self.exit_fd]

    def exited(self, fd: int) -> list[Effect]:
        """The server exited: stop watching, and let a health check say how it ended."""
        os.close(fd)
        self.exit_fd = None
        if self.stopping:
            return []
        return [Work(self.sandbox.alive, self._health_checked)]

    def health_due(self, timer: Any) -> list[Effect]:
        """The health timer fired (``timer``: what to name if it is dropped)."""
        if self.stopping:
            return [Drop(timer, "the proxy is stopping")]
        return [Work(self.sandbox.alive, self._health_checked)]

    def _health_checked(self, health: SandboxHealth | None,
                        error: BaseException | None) -> list[Effect]:
        if error is not None or health is None or not health.alive:
            cause = (health.cause if health is not None else None) or RuntimeFailure.UNREACHABLE
            detail = health.detail if health is not None else str(error)
            return self._report_failure(cause, error, detail)
        return [After(self.health_every_s(), "health")]

    def _report_failure(self, cause: RuntimeFailure, error: BaseException | None,
                        detail: str = "") -> list[Effect]:
        """Tell the supervisor what failed, then exit so it restarts a clean proxy. Once:
        a dead server is seen by its exit watch and by the request it broke alike."""
        if self.stopping:
            return []
        self.stopping = True
        if isinstance(error, StaleEpoch) or cause == RuntimeFailure.SUPERSEDED:
            # Another proxy owns the sandbox: if it is not our supervisor's, another
            # Trouper restored this session; the supervisor decides (it checks the sender).
            return [ToParent(Superseded(session_id=self.session_id, reason=mask_known(
                        f"the sandbox serves a newer proxy: {detail or error}"))),
                    Exit(f"superseded by a newer runtime proxy: {detail or error}", error)]
        named = cause != RuntimeFailure.MISCONFIGURED  # its message is the user's whole text
        text = mask_known(detail or (
            (f"{type(error).__name__}: {error}" if named else str(error)) if error else cause))
        failed = ToParent(RuntimeFailed(session_id=self.session_id, epoch=self.epoch,
                                        cause=cause, detail=text,
                                        error_class=class_path(error) if error else ""))
        if cause == RuntimeFailure.MISCONFIGURED:
            return [failed, *self._held_for_the_user(text)]
        return [failed, Exit(f"sandbox {cause}: {text}", error)]

    def _held_for_the_user(self, text: str) -> list[Effect]:
        """A sandbox that cannot work as configured: no exit, so no restart tries it again
        (the session waits in ERROR; a resume replaces this proxy). What waited is dropped."""
        logger.error("session %s: the sandbox cannot work as configured: %s",
                     self.session_id, text)
        waiting, self.waiting = self.waiting, []
        return [Drop(msg, "the sandbox cannot work as configured", logging.WARNING)
                for msg, _sender in waiting]

    def _failed_with_health(self, error: BaseException) -> list[Effect]:
        """A request failed: report the sandbox's own cause when it is dead (an OOM kill
        says more than the refused connection it led to), else the request's."""
        if isinstance(error, StaleEpoch):
            return self._report_failure(cause_of(error), error)

        def checked(health: SandboxHealth | None, _error: BaseException | None) -> list[Effect]:
            if health is not None and not health.alive and health.cause is not None:
                return self._report_failure(health.cause, error, health.detail)
            return self._report_failure(cause_of(error), error)

        return [Work(self.sandbox.alive, checked)]

    def close(self, msg: CloseSandbox, sender: Any) -> list[Effect]:
        self.stopping = True
        self.closes.append((msg, sender))
        if self.starting:  # a start waiting for an unreachable server would hold the close
            cancel = getattr(self.sandbox, "cancel", None)
            if callable(cancel):
                cancel()
        if self.starting or len(self.closes) > 1:
            return []  # answered when the start, or the stop under way, is done
        return self._close_now()

    def _close_now(self) -> list[Effect]:
        """Stop the sandbox (idempotent) and answer every close waiting for it."""
        self.stopped = False
        return [Work(self.sandbox.stop, self._closed)]

    def _closed(self, _result: object, error: BaseException | None) -> list[Effect]:
        if error is not None:
            logger.warning("session %s: the sandbox did not stop cleanly: %s",
                           self.session_id, mask_known(str(error)))
        self.stopped = True
        return self._answer_closes()

    def _answer_closes(self) -> list[Effect]:
        """Once stopped, with nothing in flight: answer every close (after what the
        requests in flight brought back, so an action's outcome precedes its end)."""
        if not self.stopped or self.in_flight:
            return []
        closes, self.closes = self.closes, []
        return [Reply(sender, SandboxClosed(request_id=msg.request_id,
                                            session_id=self.session_id))
                for msg, sender in closes]

    def _request(self, fn: Callable[[], Any], then: Done) -> Work:
        """``Work`` for a request to the sandbox, counted in ``in_flight``. One that fails
        after a close began was cut short by it: the close's answer says so."""
        self.in_flight += 1

        def done(result: Any, error: BaseException | None) -> list[Effect]:
            self.in_flight -= 1
            out = [] if self.stopping and error is not None else then(result, error)
            return out + self._answer_closes()

        return Work(fn, done)

    # -- actions ---------------------------------------------------------------

    def handle(self, msg: Any, sender: Any) -> list[Effect]:
        """An ``Execute`` or a ``ResolveAction``."""
        if isinstance(msg, Execute):
            return self.execute(msg, sender)
        return self.resolve(msg, sender)

    def _defer(self, msg: Execute | ResolveAction, sender: Any) -> list[Effect] | None:
        """The effects when ``msg`` is not for now (dropped, or held until the sandbox is
        ready); None when it is."""
        if self.stopping:
            return [Drop(msg, "the proxy is closing or exiting; nothing more starts here")]
        if msg.session_id != self.session_id:
            return [Drop(msg, "not for this session's sandbox", logging.WARNING)]
        if self.ready:
            return None
        self.waiting.append((msg, sender))  # while the sandbox starts
        return []

    def execute(self, msg: Execute, sender: Any) -> list[Effect]:
        deferred = self._defer(msg, sender)
        if deferred is not None:
            return deferred
        runtime = self.sandbox.runtime
        span = tracing.action_began(msg, self.runtime_kind)  # None unless tracing is on

        def work() -> Any:
            return runtime.execute(
                msg.action_id, msg.action, timeout_s=msg.timeout_s,
                no_output_timeout_s=msg.no_output_timeout_s, checkpoint=msg.checkpoint)

        def done(outcome: Any, error: BaseException | None) -> list[Effect]:
            tracing.action_ended(span, outcome, error)
            if isinstance(error, StoreUnavailable):  # not run: try it again, say why once
                return self._journal_blocked(msg, sender, error)
            if error is not None:
                # The action's fate is in the journal; the Controller resolves it from there.
                return self._failed_with_health(error)
            out: list[Effect] = []
            if self.blocked.pop(msg.action_id, None) is not None:
                out.append(Reply(sender, JournalFault(session_id=self.session_id,
                                                      action_id=msg.action_id, cause=None)))
            out.append(Reply(sender, Executed(session_id=self.session_id,
                                              action_id=msg.action_id, outcome=outcome)))
            return out

        return [self._request(tracing.within(span, work), done)]

    def _journal_blocked(self, msg: Execute, sender: Any,
                         error: StoreUnavailable) -> list[Effect]:
        out: list[Effect] = []
        delay_s = self.blocked.get(msg.action_id)
        if delay_s is None:
            out.append(Reply(sender, JournalFault(session_id=self.session_id,
                                                  action_id=msg.action_id, cause=error.cause)))
        delay_s = min(settings().journal_retry_max_s,
                      (delay_s or settings().journal_retry_first_s / 2) * 2)
        self.blocked[msg.action_id] = delay_s
        return [*out, After(delay_s, "execute_again", (msg, sender))]

    def resolve(self, msg: ResolveAction, sender: Any) -> list[Effect]:
        deferred = self._defer(msg, sender)
        if deferred is not None:
            return deferred
        runtime = self.sandbox.runtime

        def done(record: JournalRecord | None, error: BaseException | None) -> list[Effect]:
            if error is not None or record is None:
                return self._report_failure(cause_of(error), error)
            if record.state == "running":
                return self.resolve(msg, sender)  # still going: ask again (bounded waits)
            return [Reply(sender, Resolved(session_id=self.session_id,
                                           action_id=msg.action_id, state=record.state,
                                           outcome=record.outcome))]

        return [self._request(lambda: runtime.resolve(
            msg.action_id, wait_s=settings().journal_resolve_wait_s), done)]
