"""One session's logic as a plain state machine: no Thespian, no I/O, no clock of its own.

``SessionCore.handle(input, now)`` folds one input (a model's answer, an action's
outcome, a runtime event, a user's command, a timer) into the session and returns the
effects to perform, in order (``core.effects``). It hands each input to its handler by
type (``_HANDLERS``): the step's own two (a model's reply, an action's outcome) are
``core.loop``'s, so that one module reads as the step; every other input is here.
Everything it records goes through ``_append``, which folds the events in at once: the
core is its log's only writer, so it knows the seq each event will get. The Controller
actor (``actors/controller.py``) performs the effects; a restarted Controller builds a
fresh core from the log (``restore``), which is the whole of promise I3
(docs/promises.md).

Each input names what happened (a ``Why``) and the session moves by its row of
``core.states.TABLE``: the next state and what follows. An input with no row for the
current state is logged and skipped, so a late input cannot move a session where it
should not go (I5, I6). The Controller's own faults (a store that took no write, an
agent loop its supervisor gave up on) are inputs too: ``store_fault``, ``store_back``,
``loop_down``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from ..agent.condense import choose_cut
from ..messages.events import (
    AgentState,
    LLMRetry,
    MessageEvent,
    PromptCondensed,
    RuntimeEvent,
)
from ..messages.outcomes import Outcome
from ..messages.protocol import (
    Completed,
    CompletionFailed,
    Executed,
    JournalFault,
    Resolved,
    RetryScheduled,
    RuntimeFailed,
    RuntimeFailure,
    RuntimeProgress,
    RuntimeReady,
    UserCommand,
)
from .commands import NOT_RUN_STOPPED, UserCommands
from .effects import (
    AskModel,
    BrokerBack,
    Effect,
    RuntimeDown,
    RuntimeReplaced,
    SandboxEnded,
    StartTimer,
    TimerFired,
)
from .loop import LOST_CONTENT, SessionLoop
from .states import Why

logger = logging.getLogger(__name__)

MISCONFIGURED_PREFIX = "the sandbox cannot work as configured: "
"""How the reason of an ERROR no retry can mend begins (its cause is recorded too)."""


class SessionCore(UserCommands):
    """One session's rules: every input it takes and what each does (see the module doc)."""

    def begin(self, now: datetime) -> list[Effect]:
        """A new session's first record (its task), or a restored one's lost timers."""
        with self._step(now):
            if self.view.last_seq == 0:
                self._append(MessageEvent(source="user", text=self.config.task),
                             *self._setup_steps())
            self._schedule_lift()
            self._end_if_stopped(restored=True)
        return self._take()

    def set_instructions(self, text: str | None) -> None:
        """The workspace's instructions as the adapter read them (``ReadInstructions``)."""
        self.prompt.set_workspace_instructions(self._masked(text))

    # -- the one entry point -----------------------------------------------------------

    def handle(self, msg: Any, now: datetime) -> list[Effect]:
        """Fold ``msg`` in; the effects to perform, in order. A message the core has no
        use for changes nothing (and is logged)."""
        handler = self._HANDLERS.get(type(msg))
        with self._step(now):
            if handler is None:
                logger.warning("session %s: the core has no use for %s", self.session_id,
                               type(msg).__name__)
            else:
                handler(self, msg)
            self._end_if_stopped()
        return self._take()

    # -- the store and the agent loop: the Controller's own faults ----------------------

    def store_fault(self, cause: str, since: datetime, now: datetime) -> list[Effect]:
        """The store took no write from ``since`` until ``now`` (a full disk): record that
        as ERROR, once it takes one again. This core is fresh from the log (the one before
        ran ahead of it when the write failed); ``store_back`` follows the record."""
        with self._step(now):
            view = self.view
            self.interrupted = view.before_store_fault or (view.state, view.reason,
                                                           view.resumes_at)
            self._move(Why.STORE_FAULT, f"{cause}; nothing could be recorded from "
                       f"{since:%H:%M:%S} UTC until now", resumes_at=now)
        return self._take()

    def store_back(self, now: datetime) -> list[Effect]:
        """The store fault is recorded: go back to where the session was; RUNNING through
        the recovery path."""
        with self._step(now):
            back, self.interrupted = self.interrupted, None
            if back is None:
                logger.warning("session %s: back from a store fault it did not record",
                               self.session_id)
            elif back[0] != AgentState.RUNNING:
                state, reason, resumes_at = back
                self._move(Why.STORE_BACK, reason or "the store is writable again",
                           resumes_at=resumes_at, back_to=state)
            else:
                self.back_reason = "the store is writable again; carrying on"
                if self.runtime_ready:
                    self._ask_journal()
                self._recovered()
            self._end_if_stopped()
        return self._take()

    def loop_down(self, reason: str, resumes_at: datetime | None,
                  now: datetime) -> list[Effect]:
        """The supervisor gave up on this session's Controller (a stand-in, the log's only
        writer meanwhile, restored this core to record it): ERROR until ``resumes_at``, or
        until the user resumes with None; a session that is over stays over."""
        with self._step(now):
            self._move(Why.LOOP_DOWN, reason, resumes_at=resumes_at)
        return self._take()

    # -- runtime inputs ------------------------------------------------------------------

    def _on_runtime_ready(self, msg: RuntimeReady) -> None:
        self.runtime_ready = True
        self.resolve_first &= set(self.view.pending)
        self._ask_journal()
        self._append(RuntimeEvent(phase="attached" if msg.attached else "started",
                                  epoch=msg.epoch))
        if self.view.state == AgentState.LOADING:  # the first sandbox; later ones: recovered
            self._move(Why.RUNTIME_READY, "runtime ready")
        self._recovered()

    def _on_runtime_progress(self, msg: RuntimeProgress) -> None:
        """A step of a sandbox's start (find the image, create, start...): a status line,
        so a slow start is never a silent wait; no state changes."""
        self._append(RuntimeEvent(phase="starting", detail=f"{msg.phase}: {msg.detail}"
                                  if msg.detail else msg.phase))

    def _on_runtime_failed(self, msg: RuntimeFailed) -> None:
        """The sandbox or its proxy died; the supervisor is restarting it. Or the sandbox
        cannot work as configured: ERROR with the cause and the fix, no timer."""
        self.runtime_ready = False
        if self.dispatched is not None:
            self.resolve_first.add(self.dispatched)
            self.dispatched = None
        if msg.cause == RuntimeFailure.MISCONFIGURED:
            self._misconfigured(msg)
            return
        self._append(RuntimeEvent(phase="failed", epoch=msg.epoch, detail=msg.detail))
        self._move(Why.RUNTIME_FAILED,
                   f"sandbox failed ({msg.cause}): {msg.detail}; restarting it",
                   resumes_at=self.now)

    def _misconfigured(self, msg: RuntimeFailed) -> None:
        """Nothing restarts a sandbox that cannot work as configured: it waits for the
        user's resume (or message), which starts a fresh one (``runtime_down``)."""
        self.runtime_down = True
        reason = f"{MISCONFIGURED_PREFIX}{msg.detail}; resume once fixed"
        if self.view.reason == reason:
            return  # told again (a restarted Controller, a restored session): recorded
        self._append(RuntimeEvent(phase="failed", epoch=msg.epoch, detail=msg.detail))
        self._move(Why.RUNTIME_MISCONFIGURED, reason)

    def _on_runtime_down(self, msg: RuntimeDown) -> None:
        self.runtime_ready = False
        self.runtime_down = True
        self._move(Why.RUNTIME_DOWN, msg.reason, resumes_at=msg.resumes_at)

    def _on_runtime_replaced(self, msg: RuntimeReplaced) -> None:
        self.runtime_ready, self.runtime_down = False, False
        if self.dispatched is not None:
            self.resolve_first.add(self.dispatched)
            self.dispatched = None
        self.resolve_first |= self._runtime_pending()

    def _on_broker_back(self, msg: BrokerBack) -> None:
        if self.llm_request is not None:  # the old broker's answer will never come
            self._out.append(AskModel(self.llm_request))

    def _on_resolved(self, msg: Resolved) -> None:
        if msg.action_id not in self.resolve_first:
            return
        self.resolve_first.discard(msg.action_id)
        if msg.state == "finished" and msg.outcome is not None:
            self._record(msg.action_id, msg.outcome, advance=False)
        elif msg.state != "absent":
            self._record(msg.action_id, Outcome(status="lost", content=LOST_CONTENT),
                         advance=False)
        elif self.view.state == AgentState.STOPPED:  # never started, and never will now
            self._record(msg.action_id, Outcome(status="rejected", content=NOT_RUN_STOPPED),
                         advance=False)
        # else absent: it never started; _advance runs it now (or on a resume)
        self._recovered()

    def _on_journal_fault(self, msg: JournalFault) -> None:
        """The sandbox cannot journal the dispatched action, so it did not run; its
        proxy tries again. The log says so while it waits."""
        if msg.action_id != self.dispatched:
            return
        if msg.cause is not None:
            self._move(Why.JOURNAL_FAULT, f"{msg.cause}; waiting to run it",
                       resumes_at=self.now)
        else:
            self._move(Why.JOURNAL_BACK, "the sandbox's journal is writable again")

    # -- model inputs --------------------------------------------------------------------

    def _on_retry_scheduled(self, msg: RetryScheduled) -> None:
        if self._ours(msg.request_id):
            self._append(LLMRetry(
                request_id=msg.request_id, model=msg.model, attempt=msg.attempt,
                max_attempts=msg.max_attempts, wait_s=msg.wait_s,
                error_class=msg.error_class, message=msg.message))

    def _on_completion_failed(self, msg: CompletionFailed) -> None:
        if not self._ours(msg.request_id):
            return
        self.llm_request, self.summarizing = None, None
        if self.view.state != AgentState.RUNNING:
            return  # like a late answer: RUNNING again asks anew
        if msg.error_class == "rate_limit":
            self._rate_limited(msg)
        elif msg.error_class == "context_window" and self._condense():
            self._advance()
        else:
            self.condensed_retry = False
            self._move(Why.MODEL_FAILED, f"model call failed ({msg.error_class}, "
                       f"{msg.attempts} attempt(s)): {msg.message}")

    def _rate_limited(self, msg: CompletionFailed) -> None:
        """Retries are spent on 429s: wait for the limit to lift, by a timer."""
        wait_s = msg.retry_after_s if msg.retry_after_s is not None else (
            self.config.llm.retry_max_wait_s)
        lifts_at = self.now + timedelta(seconds=wait_s)
        self._move(
            Why.RATE_LIMITED,
            f"the provider kept answering 429 after {msg.attempts} attempt(s); carrying on "
            f"at {lifts_at:%H:%M:%S} UTC, or at once on resume", resumes_at=lifts_at)

    def _schedule_lift(self) -> None:
        resumes_at = self.view.resumes_at
        if self.view.state != AgentState.RATE_LIMITED or resumes_at is None:
            return
        self.lift_token += 1
        self._out.append(StartTimer("lift", (resumes_at - self.now).total_seconds(),
                                    self.lift_token))

    def _on_timer(self, msg: TimerFired) -> None:
        if msg.name == "end_answer":
            self._end_waited(msg.token)
        elif msg.name != "lift":
            logger.warning("session %s: no timer named %r", self.session_id, msg.name)
        elif msg.token == self.lift_token:  # a later timer took over from an older one
            self._move(Why.LIMIT_LIFTED, "the rate limit should have lifted")

    def _condense(self) -> bool:
        """Drop older messages from the prompt and try once more; False if it cannot."""
        if self.condensed_retry:
            self.condensed_retry = False
            return False
        cut = choose_cut(self.prompt.messages(), self.cut)
        if cut is None:
            return False
        self._append(PromptCondensed(cut=cut, dropped=cut - 2,
                                     reason="the prompt exceeded the model's context window"))
        self.condensed_retry = True
        return True

    _HANDLERS: dict[type, Callable[[SessionCore, Any], None]] = {
        RuntimeReady: _on_runtime_ready,
        RuntimeFailed: _on_runtime_failed,
        RuntimeProgress: _on_runtime_progress,
        RuntimeDown: _on_runtime_down,
        RuntimeReplaced: _on_runtime_replaced,
        SandboxEnded: UserCommands._on_sandbox_ended,
        BrokerBack: _on_broker_back,
        Executed: SessionLoop._on_executed,
        Resolved: _on_resolved,
        JournalFault: _on_journal_fault,
        Completed: SessionLoop._on_completed,
        RetryScheduled: _on_retry_scheduled,
        CompletionFailed: _on_completion_failed,
        TimerFired: _on_timer,
        UserCommand: UserCommands._on_user_command,
    }
