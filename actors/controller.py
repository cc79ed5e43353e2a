"""Controller: one session's agent loop, state machine and event log.

It is the only writer of its session's log. Every step: ask the broker for a completion,
append the model's actions (durable *before* any is dispatched: promise I2), run them one
at a time through the RuntimeProxy, append each outcome, and go on. A restarted
Controller rebuilds itself from the log (I3) and resolves every action that has no
outcome through the runtime's journal, never running one twice.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from thespian.actors import ActorAddress

from ..agent.parse import parse_response
from ..agent.prompt import PromptBuilder, load_workspace_instructions
from ..exceptions import LeaseLost
from ..fold import SessionView
from ..masking import SecretMasker, mask_known, remember_secrets, session_maskers
from ..messages.actions import RUNTIME_KINDS, Finish, Think
from ..messages.events import (
    ActionEvent,
    AgentState,
    Event,
    MessageEvent,
    ObservationEvent,
    PromptCondensed,
    RuntimeEvent,
)
from ..messages.outcomes import Outcome
from ..messages.protocol import (
    Complete,
    Execute,
    Executed,
    ResolveAction,
    Resolved,
    RuntimeFailed,
    RuntimeReady,
    StartSession,
    ToolCall,
)
from ..paths import Home
from ..store import EventStore, open_store
from .base import TrouperActor
from .controller_commands import CommandsMixin
from .controller_llm import ModelCallsMixin
from .controller_store import StoreFaultMixin
from .wiring import BootController, Rewire, RuntimeGaveUp, Superseded

logger = logging.getLogger(__name__)

BACK_AFTER_SANDBOX = "the sandbox is back; carrying on"


class Controller(StoreFaultMixin, ModelCallsMixin, CommandsMixin, TrouperActor):
    role = "controller"

    def __init__(self) -> None:
        super().__init__()
        self.view = SessionView()
        self.store: EventStore | None = None
        self.start: StartSession | None = None
        self.broker: ActorAddress | None = None
        self.runtime: ActorAddress | None = None
        self.runtime_ready = False
        self.runtime_down = False
        self.llm_request: Complete | None = None
        self.dispatched: str | None = None
        self.resolve_first: set[str] = set()
        self.masker = SecretMasker({})
        """Every value to keep out of the log, the prompt and the logs: the user's secrets
        and the credentials trouper holds (the LLM key among them)."""
        self.revealer = SecretMasker({})
        """Only the user's sandbox secrets: the placeholders an action may use. Never the
        masker above, or a model writing ``<secret:LLM_API_KEY>`` would get the key."""
        self.prompt: PromptBuilder | None = None
        self.owner: int | None = None
        self.cut = 0
        self.condensed_retry = False
        self.lift_token = 0
        self.lift_cooldown = False
        self.back_reason = BACK_AFTER_SANDBOX
        """Why ``recovered`` moves the session back to RUNNING (what came back)."""

    @property
    def session_id(self) -> str:
        return self.start.session_id if self.start else ""

    # -- boot and restore ------------------------------------------------------------

    def on_boot_controller(self, msg: BootController, sender: ActorAddress) -> None:
        self.set_parent(sender)
        self.start, self.broker, self.runtime = msg.start, msg.broker, msg.runtime
        config = msg.start.config
        self.masker, self.revealer = session_maskers(msg.start.secrets, config.llm)
        remember_secrets(self.masker.pairs)  # this process's log records are masked too
        home = Home.at(msg.start.home)
        self.publish_pid(home.actor_pid_path("controller", msg.start.session_id))
        self.store = open_store(home)
        self.owner = self.store.claim_owner(self.session_id)
        if not self.reload_from_log():
            self.append(MessageEvent(source="user", text=config.task))
        self.schedule_lift()  # restored while RATE_LIMITED: the timer was lost with the process
        logger.info("session %s: controller up at seq %d, state %s, %d pending",
                    self.session_id, self.view.last_seq, self.view.state.value,
                    len(self.view.pending))
        self.reply(msg.reply_to, msg.start.request_id, self.view.last_seq)

    def reload_from_log(self) -> int:
        """Fold the whole log into a fresh view and prompt; forget what was in flight (its
        outcome is asked of the journal). Returns how many events the log holds."""
        assert self.start is not None and self.store is not None
        config = self.start.config
        instructions = load_workspace_instructions(Path(config.workspace))
        self.view, self.cut = SessionView(), 0
        self.prompt = PromptBuilder(  # the prompt leaves trouper: masked like the log
            system_prompt=self._masked(config.system_prompt),
            workspace_instructions=self._masked(instructions))
        events = self.store.read(self.session_id)
        for event in events:
            self._fold(event)
        self.dispatched, self.llm_request = None, None
        self.resolve_first = self._runtime_pending()
        return len(events)

    def _runtime_pending(self) -> set[str]:
        return {
            action_id
            for action_id, event in self.view.pending.items()
            if event.action is not None and event.action.kind in RUNTIME_KINDS
        }

    def _masked(self, text: str | None) -> str | None:
        return None if text is None else self.masker.mask_text(text)

    def fail(self, reason: str, exc: BaseException | None = None, tb: str = "") -> None:
        """Exit on purpose; the reason and traceback go to the supervisor masked (it does
        not know this session's values, and records the reason in the log)."""
        super().fail(mask_known(reason), exc, mask_known(tb))

    def on_runtime_ready(self, msg: RuntimeReady, sender: ActorAddress) -> None:
        self.runtime_ready = True
        self.resolve_first &= set(self.view.pending)
        self.resolve_pending()
        phase = "attached" if msg.attached else "started"
        self.append(RuntimeEvent(phase=phase, epoch=msg.epoch))
        if self.view.state == AgentState.LOADING:
            self.transition(AgentState.RUNNING, "runtime ready")
        self.recovered()

    def recovered(self) -> None:
        """Back to RUNNING once the runtime is up and every in-flight action is resolved."""
        assert self.start is not None
        recovering = self.view.state == AgentState.ERROR and self.view.resumes_at is not None
        if recovering and self.runtime_ready and not self.resolve_first:
            if self.start.config.resume_after_runtime_restart:
                reason, self.back_reason = self.back_reason, BACK_AFTER_SANDBOX
                self.transition(AgentState.RUNNING, reason)
            else:
                self.transition(AgentState.ERROR, "the sandbox is back; resume to carry on")
        self.advance()

    def on_runtime_failed(self, msg: RuntimeFailed, sender: ActorAddress) -> None:
        """The sandbox or its proxy died; the supervisor is restarting it."""
        self.runtime_ready = False
        if self.dispatched is not None:
            self.resolve_first.add(self.dispatched)
            self.dispatched = None
        self.append(RuntimeEvent(phase="failed", epoch=msg.epoch, detail=msg.detail))
        if self.view.state == AgentState.RUNNING:
            self.transition(
                AgentState.ERROR,
                f"sandbox failed ({msg.cause}): {msg.detail}; restarting it",
                resumes_at=datetime.now(UTC),
            )

    def on_runtime_gave_up(self, msg: RuntimeGaveUp, sender: ActorAddress) -> None:
        """Past the restart intensity: ERROR until the supervisor's cooldown ends (a fresh
        proxy then arrives through ``Rewire``) or, with no ``resumes_at``, a resume."""
        self.runtime_ready = False
        self.runtime_down = True
        self.transition(AgentState.ERROR, msg.reason, resumes_at=msg.resumes_at)

    def on_rewire(self, msg: Rewire, sender: ActorAddress) -> None:
        if msg.broker is not None:
            self.broker = msg.broker
            if self.llm_request is not None:  # the old broker's answer will never come
                self.send(self.broker, self.llm_request)
        if msg.runtime is not None:
            self.runtime, self.runtime_ready, self.runtime_down = msg.runtime, False, False
            if self.dispatched is not None:
                self.resolve_first.add(self.dispatched)
                self.dispatched = None
            self.resolve_first |= self._runtime_pending()

    # -- the log ---------------------------------------------------------------

    def append(self, *events: Event) -> int:
        """Mask secrets, append durably, fold in; returns the last seq."""
        assert self.store is not None
        if self.store_fault is not None:
            raise self.store_fault  # only the probe writes until the store is back
        masked = [self.masker.mask_event(e) for e in events]
        try:
            stored = self.store.append(self.session_id, masked, owner=self.owner)
        except LeaseLost as exc:
            self.send(self._parent_address, Superseded(session_id=self.session_id,
                                                       reason=str(exc)))
            raise
        for event in stored:
            self._fold(event)
        return self.view.last_seq

    def _fold(self, event: Event) -> None:
        self.view.apply(event)
        if isinstance(event, PromptCondensed):
            self.cut = max(self.cut, event.cut)
        if self.prompt is not None:
            self.prompt.add(event)

    # -- the loop ------------------------------------------------------------------

    def advance(self) -> None:
        """Take the next step if the session is RUNNING and nothing is outstanding."""
        if self.view.state != AgentState.RUNNING or not self.runtime_ready:
            return
        if self.store_fault is not None:
            return  # nothing may start whose outcome could not be recorded
        if self.dispatched is not None or self.llm_request is not None:
            return
        if self.view.pending:
            self.handle_action(next(iter(self.view.pending.values())))
            return
        if self.limit_reached():
            return
        self.ask_model()

    def limit_reached(self) -> bool:
        assert self.start is not None
        config = self.start.config
        if self.view.iterations >= config.max_iterations:
            self.transition(
                AgentState.STOPPED,
                f"reached max_iterations ({config.max_iterations} model calls); "
                "resume to allow as many again",
            )
            return True
        if config.max_cost_usd is not None and self.view.cost_usd >= config.max_cost_usd:
            self.transition(
                AgentState.STOPPED,
                f"spent ${self.view.cost_usd:.4f} of max_cost_usd ${config.max_cost_usd:.4f}",
            )
            return True
        return False

    # -- actions ---------------------------------------------------------------

    def handle_action(self, event: ActionEvent) -> None:
        action = event.action
        if action is None:
            self.record(event.action_id, self._rejection_of(event))
        elif isinstance(action, Think):
            self.record(event.action_id, Outcome(status="ok", content="Thought recorded."))
        elif isinstance(action, Finish):
            self.finish(event, action)
        elif event.action_id in self.resolve_first:
            return  # its journal is being asked (resolve_pending); never re-run
        else:
            self.dispatch(event)

    def dispatch(self, event: ActionEvent) -> None:
        assert self.start is not None
        config = self.start.config
        action: Any = event.action
        timeout_s = getattr(action, "timeout_s", None) or config.command_timeout_s
        self.dispatched = event.action_id
        self.send(self.runtime, Execute(
            session_id=self.session_id, action_id=event.action_id,
            action=self.revealer.reveal(action),
            timeout_s=timeout_s, no_output_timeout_s=config.no_output_timeout_s))

    @staticmethod
    def _rejection_of(event: ActionEvent) -> Outcome:
        call = ToolCall(id=event.tool_call_id, name=event.tool, arguments=event.arguments)
        parsed = parse_response(event.turn_id, "", [call], lambda: event.action_id)
        if parsed and parsed[0].rejection is not None:
            return parsed[0].rejection
        return Outcome(status="rejected", content=f"The call to {event.tool!r} was malformed.")

    def finish(self, event: ActionEvent, action: Finish) -> None:
        """The finish's outcome, the rest of the turn rejected, and FINISHED: one append, so
        a restart can never find the finish answered and run the actions after it."""
        done = ObservationEvent(action_id=event.action_id,
                                outcome=Outcome(status="ok", content=action.message))
        skipped = [
            ObservationEvent(action_id=other, outcome=Outcome(
                status="rejected", content="Not run: the agent finished before this action."))
            for other in self.view.pending
            if other != event.action_id
        ]
        self.resolve_first.clear()
        self.transition(AgentState.FINISHED, action.message, along=[done, *skipped])

    def record(self, action_id: str, outcome: Outcome, advance: bool = True) -> None:
        self.resolve_first.discard(action_id)
        if action_id not in self.view.pending:
            return  # already has its outcome (promise I1)
        self.append(ObservationEvent(action_id=action_id, outcome=outcome))
        if advance:
            self.check_breaker()
            self.advance()

    def check_breaker(self) -> None:
        assert self.start is not None
        limit = self.start.config.max_consecutive_timeouts
        if limit and self.view.consecutive_timeouts >= limit and (
            self.view.state == AgentState.RUNNING
        ):
            self.transition(
                AgentState.PAUSED,
                f"{self.view.consecutive_timeouts} commands in a row timed out; "
                "check the sandbox, then resume",
            )

    def on_executed(self, msg: Executed, sender: ActorAddress) -> None:
        if msg.action_id == self.dispatched:
            self.dispatched = None
        self.record(msg.action_id, msg.outcome)

    def resolve_pending(self) -> None:
        """Ask the runtime's journal about every action that may have run without an outcome."""
        for action_id in sorted(self.resolve_first):
            self.send(self.runtime, ResolveAction(session_id=self.session_id, action_id=action_id))

    def on_resolved(self, msg: Resolved, sender: ActorAddress) -> None:
        if msg.action_id not in self.resolve_first:
            return
        self.resolve_first.discard(msg.action_id)
        if msg.state == "finished" and msg.outcome is not None:
            self.record(msg.action_id, msg.outcome, advance=False)
        elif msg.state == "absent":
            pass  # it never started: advance() runs it now, for the first time
        else:
            self.record(msg.action_id, Outcome(status="lost", content=(
                "This action's result is unknown: the sandbox that ran it was lost before it "
                "reported back. It was not run again. Check its effects before repeating it.")),
                advance=False)
        self.recovered()

