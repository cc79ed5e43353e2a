"""SessionHost: a whole session in one process, the hosted layout's only session actor.

In the split layout a session is three processes: a SessionSupervisor, a Controller, and
a RuntimeProxy the Controller sends each action to. The SessionHost is the Controller
(its rules, its store, the log's only writer) driving the sandbox itself, through
``runtimes/hosted.py``'s ``HostedRuntime`` (the proxy's ``RuntimeDriver``, restarted
under the session's policy as the SessionSupervisor restarted the proxy), and the root
supervises it directly (``actors/hosted_sessions.py``): two processes and two actor hops
per action fewer. When it dies its driver dies with it; the next incarnation attaches to
the sandbox, which outlives both, and asks the journal what the last one left (I2, I3 in
docs/promises.md).

What the runtime says for the core (``RuntimeReady``, ``Executed`` ...) is queued and fed
to the core once the handler that produced it is done, as a message from a proxy would
be: the core never gets an input while its adapter still performs the last one's effects.

A session settled for ``settled_stand_down_s`` with nothing pending stands down, so that
a program running many sessions holds only the live ones: it tells the root
(``StandingDown``, with the number of relays it has had), and the root, if no command is
on its way to it, holds the session's commands and says go (``StandDown``); the host
closes its sandbox and says so (``SteppedDown``), and the root stops it. The next command
restores the session from its log; one that came meanwhile does at once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from thespian.actors import ActorAddress, ActorExitRequest

from ..config.models import RestartPolicy
from ..config.settings import settings
from ..core.effects import (
    AskJournal,
    BrokerBack,
    Effect,
    EndSandbox,
    RestartRuntime,
    RunAction,
)
from ..core.states import settled
from ..home.paths import Home
from ..messages.protocol import (
    Accepted,
    CloseSandbox,
    Refusal,
    Refused,
    ResolveAction,
    SandboxClosed,
    StartSession,
)
from ..messages.tree import (
    BootController,
    BrokerMoved,
    CloseFor,
    FailRuntime,
    ForgetHistory,
    Relay,
    Shutdown,
    ShutdownDone,
    StandDown,
    StandingDown,
    SteppedDown,
)
from ..runtimes import Sandbox
from ..runtimes.driver import After, Drop, Reply, ToParent, Work
from ..runtimes.hosted import TIMER, HostedEffect, HostedRuntime, ToCore
from ..runtimes.session_sandbox import session_sandbox
from ..security.masking import remember_secrets, session_maskers
from .controller import Controller

logger = logging.getLogger(__name__)

STAND_DOWN = "stand-down"
"""The request id of the sandbox close a stand-down makes."""
RESTORED_GRACE_S = 5.0
"""A restored host stands down no sooner than this after its start: one restored for a
command is settled at once, and the command is on its way."""

class SessionHost(Controller):
    # "controller": its pid is the one kill_actor(session, "controller") kills
    role = "controller"
    FIRST = (*Controller.FIRST, CloseFor)

    def __init__(self) -> None:
        super().__init__()
        self.hosted: HostedRuntime | None = None
        self.for_core: deque[Any] = deque()
        """What the runtime said for the core, fed once the current handler is done."""
        self.closing_only = False
        """A stand-in that only closes the sandbox of a session whose host is down."""
        self.relays_seen = 0
        """Relays (user commands) received: the root stands it down only when it has
        sent no more than this."""
        self.standing_down = False
        self._stand_down_seq: int | None = None
        """The settled log position a stand-down timer waits on."""
        self._grace_until = 0.0
        """No stand-down before this (``time.monotonic()``): set for a restored host."""

    def on_boot_controller(self, msg: BootController, sender: ActorAddress) -> None:
        start = msg.start
        if start.restore:
            self._grace_until = time.monotonic() + RESTORED_GRACE_S
        home = Home.at(start.home)
        self.hosted = HostedRuntime(start.session_id, self._sandbox_maker(start),
                                    msg.policy or RestartPolicy())
        # no SessionSupervisor: killing "the session" kills this process
        self.publish_pid(home.actor_pid_path("session", start.session_id))
        # the Controller's boot first: it learns the secrets to mask (the sandbox's start
        # may log), and the core asks nothing of a runtime that has not said it is ready
        super().on_boot_controller(msg, sender)

    def booted_up(self) -> None:
        """The core is up (at the boot, or once the store took writes again): then the
        sandbox's driver starts."""
        super().booted_up()
        if self.hosted is not None and self.hosted.driver is None:  # (an early command
            self.perform_runtime(self.hosted.boot())  # may have started one)

    def _sandbox_maker(self, start: StartSession) -> Callable[[int], Sandbox]:
        def make_sandbox(incarnation: int) -> Sandbox:
            sandbox = session_sandbox(start)
            if hasattr(sandbox, "progress"):  # a backend that reports the steps of its start
                sandbox.progress = (  # type: ignore[attr-defined]
                    lambda phase, detail: self._progress_from_worker(incarnation, phase, detail))
            return sandbox

        return make_sandbox

    def _progress_from_worker(self, incarnation: int, phase: str, detail: str) -> None:
        """Called on the worker thread that starts the sandbox: hand it to the actor."""
        self.background.submit(lambda: (phase, detail),
                               lambda step, _error: self._progressed(incarnation, step))

    def _progressed(self, incarnation: int, step: tuple[str, str] | None) -> None:
        if step is not None and self.hosted is not None and not self._stopping:
            self.perform_runtime(self.hosted.progressed(incarnation, *step))

    # -- the core's requests of the runtime ---------------------------------------

    def _perform(self, effect: Effect) -> None:
        hosted = self.hosted
        if hosted is None:
            super()._perform(effect)
        elif isinstance(effect, RunAction):
            self.perform_runtime(hosted.handle(effect.request))
        elif isinstance(effect, AskJournal):
            self.perform_runtime(hosted.handle(ResolveAction(
                session_id=self.session_id, action_id=effect.action_id)))
        elif isinstance(effect, RestartRuntime):
            self.perform_runtime(hosted.restart(effect.reason))
        elif isinstance(effect, EndSandbox):
            self.perform_runtime(hosted.end(effect.reason))
        else:
            super()._perform(effect)

    # -- the runtime's inputs ---------------------------------------------------

    def on_relay(self, msg: Relay, sender: ActorAddress) -> None:
        self.relays_seen += 1
        inner = msg.msg
        if not isinstance(inner, FailRuntime):
            super().on_relay(msg, sender)
            return
        answer: Any
        if self.hosted is None or self.hosted.driver is None or self.hosted.ended:
            answer = Refused(request_id=inner.request_id, session_id=inner.session_id,
                             error=Refusal.INVALID_REQUEST,
                             message="no sandbox driver is running in this session now")
        else:
            self.perform_runtime(self.hosted.crash(inner.reason))
            answer = Accepted(request_id=inner.request_id, session_id=inner.session_id)
        if msg.reply_to is not None:
            self.send(msg.reply_to, answer)

    def _dispatch(self, msg: Any, sender: ActorAddress) -> None:
        super()._dispatch(msg, sender)
        while self.for_core and not self._stopping:
            self.feed(self.for_core.popleft())
        self._consider_standing_down()

    # -- standing down once settled -----------------------------------------------

    def _idle_settled(self) -> bool:
        view = self.view  # (``view.settled`` builds an event: too dear for every message)
        return (self.core is not None and self.hosted is not None and not self.closing_only
                and not self._stopping and self.store_fault is None
                and settled(view.state, view.resumes_at)
                and not view.pending and not self.for_core and not self.hosted.closing)

    def _consider_standing_down(self) -> None:
        """Set the stand-down timer for this settled position of the log (once)."""
        if self.standing_down or not self._idle_settled():
            return
        seq = self.view.last_seq
        if self._stand_down_seq != seq:
            self._stand_down_seq = seq
            grace_s = self._grace_until - time.monotonic()
            self.after(max(settings().settled_stand_down_s, grace_s), "stand_down", seq)

    def on_timer_stand_down(self, seq: int) -> None:
        if self.standing_down or seq != self.view.last_seq:
            return  # it moved meanwhile: a later settled position sets its own timer
        if not self._idle_settled():  # busy for now at this position: set again once idle
            self._stand_down_seq = None
            return
        self.standing_down = True
        self.send(self._parent_address, StandingDown(session_id=self.session_id,
                                                     relays=self.relays_seen))

    def on_stand_down(self, msg: StandDown, sender: ActorAddress) -> None:
        if not self.from_parent(msg, sender, "who supervises the session"):
            return
        if not self.standing_down:
            self.drop(msg, "it asked for no stand-down")
            return
        if not msg.go:  # a command is on its way: it comes, or the timer is set again
            self.standing_down, self._stand_down_seq = False, None
            return
        if self.hosted is None or not self._idle_settled():  # work came meanwhile
            self.standing_down, self._stand_down_seq = False, None
            self.send(sender, SteppedDown(session_id=self.session_id, stayed=True))
            return
        logger.info("session %s: settled for %g s: closing its sandbox and standing down "
                    "(the next command restores it)", self.session_id,
                    settings().settled_stand_down_s)
        self.perform_runtime(self.hosted.close(CloseSandbox(request_id=STAND_DOWN),
                                               self.myAddress))

    def on_timer_runtime(self, token: tuple[int, str, Any]) -> None:
        if self.hosted is not None:
            self.perform_runtime(self.hosted.on_timer(token))

    def watched_fds(self) -> list[int]:
        return [] if self.hosted is None else self.hosted.watched_fds()

    def on_fd_ready(self, fd: int) -> None:
        """The sandbox server exited (its pidfd is closed here, on the actor's thread)."""
        if self.hosted is not None:
            self.perform_runtime(self.hosted.exited(fd))

    def on_shutdown(self, msg: Shutdown, sender: ActorAddress) -> None:
        """The tree closes: stop the sandbox if asked, then answer (``ShutdownDone``)."""
        if not self.from_parent(msg, sender, "who closes the tree"):
            return
        if not msg.stop_sandboxes or self.hosted is None:
            self.send(sender, ShutdownDone(request_id=msg.request_id))
            return
        self.perform_runtime(self.hosted.close(CloseSandbox(request_id=msg.request_id), sender))

    def on_close_for(self, msg: CloseFor, sender: ActorAddress) -> None:
        """A stand-in's whole life: the tree closes while this session's host is down.
        Stop its sandbox, answer ``ShutdownDone``, exit."""
        self.set_parent(sender)
        self.start = msg.start
        remember_secrets(session_maskers(msg.start.secrets, msg.start.config.llm,
                                         msg.start.config.runtime)[0].pairs)
        self.closing_only = True
        self.hosted = HostedRuntime(msg.start.session_id, self._sandbox_maker(msg.start),
                                    RestartPolicy())
        self.perform_runtime(self.hosted.close(CloseSandbox(request_id=msg.request_id), sender))

    def on_broker_moved(self, msg: BrokerMoved, sender: ActorAddress) -> None:
        if not self.from_parent(msg, sender, "who owns the broker"):
            return
        self.broker = msg.broker
        self.history.forget()  # a new broker has nothing of it
        self.feed(BrokerBack())

    def on_exit_request(self, msg: ActorExitRequest, sender: ActorAddress) -> None:
        if self.hosted is not None:
            self.hosted.stop()
        super().on_exit_request(msg, sender)

    def fail(self, reason: str, exc: BaseException | None = None, tb: str = "") -> None:
        if self.hosted is not None:
            self.hosted.stop()
        super().fail(reason, exc, tb)

    # -- the runtime's effects ---------------------------------------------------

    def perform_runtime(self, effects: list[HostedEffect]) -> None:
        for effect in effects:
            if isinstance(effect, ToCore):
                self.for_core.append(effect.msg)
            elif isinstance(effect, ToParent):
                self.send(self._parent_address, effect.msg)
            elif (isinstance(effect, Reply) and isinstance(effect.msg, SandboxClosed)
                  and effect.msg.request_id == STAND_DOWN and self.standing_down):
                if self.broker is not None:  # its history, kept for the next request
                    self.send(self.broker, ForgetHistory(session_id=self.session_id))
                self.send(self._parent_address, SteppedDown(session_id=self.session_id))
            elif isinstance(effect, Reply) and isinstance(effect.msg, SandboxClosed):
                # only a shutdown closes the sandbox here: it is answered in its terms
                closed = [effect.msg.session_id] if effect.msg.session_id else []
                self.send(effect.to, ShutdownDone(request_id=effect.msg.request_id,
                                                  sessions=closed))
                if self.closing_only:  # a stand-in that only closed: its work is done
                    self.send(self.myAddress, ActorExitRequest())
            elif isinstance(effect, Reply):
                self.send(effect.to, effect.msg)
            elif isinstance(effect, Work):
                then = effect.then
                self.background.submit(effect.fn, lambda result, error, then=then:
                                       self.perform_runtime(then(result, error)))
            elif isinstance(effect, After):
                self.after(effect.delay_s, TIMER, effect.token)
            elif isinstance(effect, Drop):
                self.drop(effect.msg, effect.why, effect.level)
