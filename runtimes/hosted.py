"""One session's sandbox run inside the session's own process: the hosted layout's runtime.

In the split layout a RuntimeProxy actor drives the sandbox and the SessionSupervisor
restarts it when it fails. In the hosted layout (``docs/architecture.md``, "Layouts") the
Controller's process drives it: ``HostedRuntime`` holds one ``RuntimeDriver`` at a time
(an *incarnation*) and does what the SessionSupervisor did for the proxy, under the same
``RestartPolicy``: a failed driver is replaced at once, then after a backoff; past the
intensity the sandbox is given up on for a cooldown (``RuntimeDown`` to the core), and a
user's resume starts it again from a clean budget.

Like the driver it imports no Thespian and never blocks; each input returns effects:
``ToCore`` (an input for the session core: ``RuntimeReady``, ``Executed``,
``RuntimeReplaced`` ...), ``ToParent`` (``Superseded``: another Trouper owns the sandbox),
``Reply`` (``SandboxClosed``), ``Work``, ``After`` and ``Drop``. What an incarnation that
failed leaves behind (its workers' results, its timers) is dropped, as a dead proxy's
late words were: the core asks the journal instead, so nothing runs twice (I2,
docs/promises.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config.models import RestartPolicy
from ..core.effects import RuntimeDown, RuntimeReplaced, SandboxEnded
from ..messages.protocol import (
    CloseSandbox,
    Execute,
    ResolveAction,
    RuntimeFailed,
    RuntimeFailure,
    RuntimeReady,
    SandboxClosed,
)
from ..messages.tree import Superseded
from ..security.masking import mask_known
from ..supervisor import RestartBudget, give_up_text
from .base import Sandbox
from .driver import After, Drop, Effect, Exit, Reply, RuntimeDriver, ToParent, Work

logger = logging.getLogger(__name__)

END = "end"
"""The request id of the sandbox close an ``end`` makes."""

CORE = "core"
"""Who asked, for the requests that come from the session core (the driver's replies to
it become ``ToCore``)."""

TIMER = "runtime"
"""The name of every timer this runtime sets; ``on_timer`` takes the token back."""


@dataclass
class ToCore:
    """An input for the session core."""

    msg: Any


HostedEffect = ToCore | ToParent | Reply | Work | After | Drop


class HostedRuntime:
    """The sandbox of one session, driven in its process (see the module doc)."""

    def __init__(
        self,
        session_id: str,
        make_sandbox: Callable[[int], Sandbox],
        policy: RestartPolicy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session_id = session_id
        self.make_sandbox = make_sandbox
        """Builds the backend for incarnation ``n`` (its progress reports name ``n``)."""
        self.policy = policy
        self.budget = RestartBudget(policy, clock)
        self.driver: RuntimeDriver | None = None
        self.incarnation = 0
        self.ready = False
        self.closing = False
        """Told to close, or stood down: no incarnation starts after this."""
        self.ended = False
        """The session stopped (``end``): no incarnation starts until ``restart``."""
        self.unfinished_start: int | None = None
        """A failed incarnation whose sandbox start still runs on a worker: no new one
        starts until it is done (two starts at once could both claim the sandbox, and the
        failed one's later claim would fence the new driver out)."""
        self.deferred: str | None = None
        """Why a new incarnation waits for that start (its restart reason)."""
        self.pending_closes: list[tuple[CloseSandbox, Any]] = []
        """Closes that wait for that start too, with no driver to take them."""

    # -- lifecycle -------------------------------------------------------------

    def boot(self) -> list[HostedEffect]:
        if self.ended:  # a session restored stopped: no sandbox until it goes on
            return []
        return self._start()

    def _start(self) -> list[HostedEffect]:
        self.incarnation += 1
        self.ready = False
        self.driver = RuntimeDriver(self.session_id, self.make_sandbox(self.incarnation))
        return self._wrap(self.driver.start(), self.incarnation)

    def _replace(self, reason: str) -> list[HostedEffect]:
        """A fresh incarnation; the core asks its journal what the old one left."""
        if self.unfinished_start is not None:
            self.deferred = reason
            return []
        logger.info("session %s: sandbox driver %d: %s", self.session_id,
                    self.incarnation + 1, reason)
        return [ToCore(RuntimeReplaced()), *self._start()]

    def restart(self, reason: str) -> list[HostedEffect]:
        """Start a fresh incarnation from a clean budget (the user resumed a session whose
        sandbox was given up on); a live one is let go first."""
        if self.closing:
            return [Drop(reason, "the sandbox is closing")]
        self.ended = False
        self.budget.restarted(by_hand=True)
        self._let_go()
        return self._replace(reason)

    def crash(self, reason: str) -> list[HostedEffect]:
        """Fail the live incarnation as a killed proxy would (the fault harness)."""
        if self.driver is None or self.ended:
            return [Drop(reason, "no sandbox driver is running")]
        return self._failed(reason)

    def close(self, msg: CloseSandbox, reply_to: Any) -> list[HostedEffect]:
        """Stop the sandbox and answer ``SandboxClosed``; nothing starts after this. With
        no driver (restarting, given up) a fresh one stops the sandbox (a backend stops
        what runs without having started it), once a failed one's start is done."""
        self.closing = True
        if self.driver is not None:
            return self._wrap(self.driver.close(msg, reply_to), self.incarnation)
        self.pending_closes.append((msg, reply_to))
        return [] if self.unfinished_start is not None else self._close_down()

    def end(self, reason: str) -> list[HostedEffect]:
        """The session stopped: stop the sandbox now, as ``close`` does, and tell the core
        (``SandboxEnded``) once it is stopped and what was in flight has come back. No
        incarnation starts after this until ``restart`` (the session goes on)."""
        logger.info("session %s: ending the sandbox (%s)", self.session_id, reason)
        self.ended = True
        msg = CloseSandbox(request_id=END)
        if self.driver is not None:
            return self._wrap(self.driver.close(msg, CORE), self.incarnation)
        self.pending_closes.append((msg, CORE))
        return [] if self.unfinished_start is not None else self._close_down()

    def _close_down(self) -> list[HostedEffect]:
        """Close the sandbox of a session whose driver is down, for every close waiting."""
        closes, self.pending_closes = self.pending_closes, []
        self.incarnation += 1
        self.driver = RuntimeDriver(self.session_id, self.make_sandbox(self.incarnation))
        out: list[HostedEffect] = []
        for msg, reply_to in closes:
            out += self._wrap(self.driver.close(msg, reply_to), self.incarnation)
        return out

    def stop(self) -> None:
        """The process is exiting: the live incarnation starts nothing more."""
        self.closing = True
        if self.driver is not None:
            self.driver.stopping = True

    def _let_go(self) -> None:
        """Forget the live incarnation (its late results are dropped by incarnation)."""
        driver, self.driver = self.driver, None
        self.ready = False
        if driver is not None:
            if driver.starting:
                self.unfinished_start = self.incarnation
            driver.stopping = True
            if driver.exit_fd is not None:
                os.close(driver.exit_fd)
                driver.exit_fd = None

    def _failed(self, reason: str) -> list[HostedEffect]:
        """The incarnation failed (what a proxy's exit was): replace it under the policy."""
        was_ready = self.ready
        self._let_go()
        if self.closing or self.ended:  # closed, stood down or stopped: none is wanted now
            return []
        out: list[HostedEffect] = []
        if was_ready:  # one that reported its failure first already told the core
            out.append(ToCore(RuntimeFailed(session_id=self.session_id, epoch=0,
                                            cause=RuntimeFailure.EXITED, detail=reason)))
        logger.warning("session %s: the sandbox driver failed: %s", self.session_id, reason)
        restart, wait_s = self.budget.failed()
        if not restart:
            text, resumes_at = give_up_text("the sandbox", self.policy, reason, wait_s)
            out.append(ToCore(RuntimeDown(reason=text, resumes_at=resumes_at)))
            if wait_s is not None:
                out.append(After(wait_s, TIMER, (self.incarnation, "cooldown_over", None)))
            return out
        backoff_s = wait_s or 0.0
        if backoff_s <= 0:
            return out + self._replace(reason)
        return out + [After(backoff_s, TIMER, (self.incarnation, "restart", reason))]

    @property
    def given_up(self) -> bool:
        """Past the intensity: no driver until the cooldown ends or the user resumes."""
        return self.budget.given_up

    # -- inputs ----------------------------------------------------------------

    def handle(self, msg: Execute | ResolveAction) -> list[HostedEffect]:
        """A request of the core."""
        if self.driver is None:  # the core resolves it from the journal once replaced
            return [Drop(msg, "the sandbox is down; asked of the journal once it is back")]
        return self._wrap(self.driver.handle(msg, CORE), self.incarnation)

    def progressed(self, incarnation: int, phase: str, detail: str) -> list[HostedEffect]:
        if incarnation != self.incarnation or self.driver is None:
            return []
        return self._wrap(self.driver.progressed(phase, detail), incarnation)

    def watched_fds(self) -> list[int]:
        return [] if self.driver is None else self.driver.watched_fds()

    def exited(self, fd: int) -> list[HostedEffect]:
        if self.driver is None or fd not in self.driver.watched_fds():
            return [Drop(fd, "not the live sandbox's exit watch")]
        return self._wrap(self.driver.exited(fd), self.incarnation)

    def on_timer(self, token: tuple[int, str, Any]) -> list[HostedEffect]:
        incarnation, name, inner = token
        if incarnation != self.incarnation:
            return [Drop(name, "a timer of a replaced sandbox driver")]
        if name == "restart":
            if self.driver is not None or self.given_up or self.closing or self.ended:
                return [Drop(name, "the sandbox is back, given up, closing or ended")]
            return self._replace(inner)
        if name == "cooldown_over":
            if not self.given_up or self.closing or self.ended:
                return [Drop(name, "the sandbox is back, closing or ended")]
            self.budget.restarted(by_hand=False)
            return self._replace(f"cooldown over after give-up round {self.budget.rounds}; "
                                 "trying again")
        if self.driver is None:
            return [Drop(name, "the sandbox is down")]
        if name == "health":
            return self._wrap(self.driver.health_due(name), incarnation)
        msg, sender = inner  # "execute_again": an action the journal refused never started
        return self._wrap(self.driver.handle(msg, sender), incarnation)

    # -- the driver's effects, made this runtime's ------------------------------

    def _wrap(self, effects: list[Effect], incarnation: int) -> list[HostedEffect]:
        out: list[HostedEffect] = []
        for effect in effects:
            if not self._live(incarnation):
                out.append(Drop(effect, "from a sandbox driver that failed"))
            elif isinstance(effect, ToParent):
                out += self._report(effect.msg)
            elif isinstance(effect, Reply) and effect.to == CORE:
                ended = isinstance(effect.msg, SandboxClosed)  # only an end replies it here
                out.append(ToCore(SandboxEnded() if ended else effect.msg))
            elif isinstance(effect, Reply):
                out.append(effect)
            elif isinstance(effect, Work):
                out.append(Work(effect.fn, self._then(effect, incarnation)))
            elif isinstance(effect, After):
                out.append(After(effect.delay_s, TIMER,
                                 (incarnation, effect.name, effect.token)))
            elif isinstance(effect, Exit):
                out += self._failed(mask_known(effect.reason))
            else:
                out.append(effect)
        return out

    def _then(self, work: Work, incarnation: int) -> Callable[..., list[Any]]:
        def then(result: Any, error: BaseException | None) -> list[HostedEffect]:
            if not self._live(incarnation):
                dropped: list[HostedEffect] = [
                    Drop(work.fn, "the result of a failed sandbox driver's work")]
                return dropped + self._start_done(incarnation)
            return self._wrap(work.then(result, error), incarnation)
        return then

    def _start_done(self, incarnation: int) -> list[HostedEffect]:
        """A failed incarnation's work came back: if it was the start a new incarnation
        waits for (the only work of a starting driver), start that one now."""
        if incarnation != self.unfinished_start:
            return []
        self.unfinished_start = None
        reason, self.deferred = self.deferred, None
        if self.pending_closes:
            return self._close_down()
        if reason is None or self.driver is not None or self.closing or self.given_up \
                or self.ended:
            return []
        return self._replace(reason)

    def _live(self, incarnation: int) -> bool:
        return self.driver is not None and incarnation == self.incarnation

    def _report(self, msg: Any) -> list[HostedEffect]:
        if isinstance(msg, Superseded):  # another Trouper's runtime owns it: stand down
            self.closing = True
            return [ToParent(msg)]
        if isinstance(msg, RuntimeReady):
            self.ready = True
        elif isinstance(msg, RuntimeFailed):
            self.ready = False
        return [ToCore(msg)]
