"""The Controller's side of model calls: asking, answers, retries seen, rate limits,
and condensing a prompt that outgrew the context window."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from thespian.actors import ActorAddress

from ..agent.condense import choose_cut, condensed
from ..agent.parse import parse_response
from ..agent.tools import tool_specs
from ..messages.events import (
    AgentState,
    LLMCompleted,
    LLMRetry,
    MessageEvent,
    ObservationEvent,
    PromptCondensed,
)
from ..messages.protocol import Complete, Completed, CompletionFailed, RetryScheduled

if TYPE_CHECKING:
    from .controller import Controller

logger = logging.getLogger(__name__)


def new_action_id() -> str:
    return uuid.uuid4().hex[:16]


class ModelCallsMixin:
    """Model calls for the Controller (mixed into it; ``self`` is a Controller)."""

    def ask_model(self: Controller) -> None:
        """Ask for the next turn; with no broker yet (it is being restarted), the request
        waits and ``on_rewire`` sends it to the new one."""
        assert self.start is not None and self.prompt is not None
        # model_construct: the history is ours and already valid; validating it again
        # would walk every message of the session on every step
        self.llm_request = Complete.model_construct(
            request_id=uuid.uuid4().hex, session_id=self.session_id, llm=self.start.config.llm,
            messages=condensed(self.prompt.messages(), self.cut), tools=tool_specs(),
            turn=self.view.total_iterations, lift_cooldown=self.lift_cooldown)
        self.lift_cooldown = False
        if self.broker is not None:
            self.send(self.broker, self.llm_request)

    def on_completed(self: Controller, msg: Completed, sender: ActorAddress) -> None:
        if self.llm_request is None or msg.request_id != self.llm_request.request_id:
            return  # the answer to a cancelled or superseded request
        self.llm_request = None
        if self.view.state != AgentState.RUNNING:
            # the session left RUNNING while the model thought: actions recorded now could
            # not run, and would wait without an outcome (I5); RUNNING again asks anew
            logger.info("session %s: dropped a model reply that came in %s", self.session_id,
                        self.view.state.value)
            return
        self.condensed_retry = False
        turn_id = uuid.uuid4().hex[:12]
        parsed = parse_response(turn_id, msg.content, msg.tool_calls, new_action_id)
        usage = LLMCompleted(
            request_id=msg.request_id, model=msg.model, prompt_tokens=msg.prompt_tokens,
            completion_tokens=msg.completion_tokens, cost_usd=msg.cost_usd,
            latency_s=msg.latency_s, attempts=msg.attempts)
        if not parsed:
            self.append(usage, MessageEvent(source="agent", text=msg.content))
            self.transition(AgentState.AWAITING_USER_INPUT, "the agent replied with text")
            return
        self.append(usage, *[p.event for p in parsed])  # intents durable before dispatch
        rejected = [
            ObservationEvent(action_id=p.event.action_id, outcome=p.rejection)
            for p in parsed
            if p.rejection is not None
        ]
        if rejected:
            self.append(*rejected)
        self.advance()

    def on_retry_scheduled(self: Controller, msg: RetryScheduled, sender: ActorAddress) -> None:
        if self.llm_request is None or msg.request_id != self.llm_request.request_id:
            return
        self.append(LLMRetry(
            request_id=msg.request_id, model=msg.model, attempt=msg.attempt,
            max_attempts=msg.max_attempts,
            wait_s=msg.wait_s, error_class=msg.error_class, message=msg.message))

    def on_completion_failed(self: Controller, msg: CompletionFailed, sender: ActorAddress) -> None:
        if self.llm_request is None or msg.request_id != self.llm_request.request_id:
            return
        self.llm_request = None
        if msg.error_class == "rate_limit":
            self.rate_limited(msg)
        elif msg.error_class == "context_window" and self.condense():
            self.advance()
        else:
            self.condensed_retry = False
            self.transition(
                AgentState.ERROR,
                f"model call failed ({msg.error_class}, {msg.attempts} attempt(s)): "
                f"{msg.message}",
            )

    def rate_limited(self: Controller, msg: CompletionFailed) -> None:
        """Retries are spent on 429s: wait for the limit to lift, by a timer."""
        assert self.start is not None
        wait_s = msg.retry_after_s if msg.retry_after_s is not None else (
            self.start.config.llm.retry_max_wait_s)
        lifts_at = datetime.now(UTC) + timedelta(seconds=wait_s)
        self.transition(
            AgentState.RATE_LIMITED,
            f"the provider kept answering 429 after {msg.attempts} attempt(s); carrying on at "
            f"{lifts_at:%H:%M:%S} UTC, or at once on resume",
            resumes_at=lifts_at,
        )
        self.schedule_lift()

    def schedule_lift(self: Controller) -> None:
        resumes_at = self.view.resumes_at
        if self.view.state != AgentState.RATE_LIMITED or resumes_at is None:
            return
        self.lift_token += 1
        delay_s = (resumes_at - datetime.now(UTC)).total_seconds()
        self.after(delay_s, "lift", self.lift_token)

    def on_timer_lift(self: Controller, token: int) -> None:
        if token == self.lift_token and self.view.state == AgentState.RATE_LIMITED:
            self.transition(AgentState.RUNNING, "the rate limit should have lifted")
            self.advance()

    def condense(self: Controller) -> bool:
        """Drop older messages from the prompt and try once more; False if it cannot help."""
        assert self.prompt is not None
        if self.condensed_retry:
            self.condensed_retry = False
            return False
        cut = choose_cut(self.prompt.messages(), self.cut)
        if cut is None:
            return False
        self.append(PromptCondensed(cut=cut, dropped=cut - 2,
                                    reason="the prompt exceeded the model's context window"))
        self.condensed_retry = True
        return True

