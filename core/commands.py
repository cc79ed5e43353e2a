"""The user's commands to a session: send, pause, resume, stop, approve and reject.

Each is carried out once: its first event names it (``command_id``, set by
``SessionMachine._marked``), so a command handed again (its taker died before it
answered, or a client sent it again under its idempotency key) is answered with the
seq of that event and not carried out twice (``actors/in_flight.py``).
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..messages.events import (
    AgentState,
    BudgetChanged,
    ConfirmationEvent,
    MessageEvent,
    ObservationEvent,
)
from ..messages.outcomes import Outcome
from ..messages.protocol import UserCommand
from .effects import Answer
from .ending import SandboxEnding
from .fold import RESUMED_BY_USER
from .states import Why

logger = logging.getLogger(__name__)


class BudgetLimits(BaseModel):
    """A ``budget`` command's limits (its text, as JSON)."""

    model_config = ConfigDict(extra="forbid")

    max_cost_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_iterations: int | None = Field(default=None, gt=0)


def pydantic_text(exc: ValueError) -> str:
    """A refused budget in one line: the field and why."""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        return f"{where}: {first['msg']}"
    return str(exc)

NOT_RUN_STOPPED = "Not run: the user stopped the session first."
REFUSALS = {(AgentState.FINISHED, "resume"):
            "the session is finished; send a message to give it more work"}
"""A refusal said better than "cannot <command> a session that is <state>"."""


class UserCommands(SandboxEnding):
    """What each user command does to the session (``SessionCore`` takes them)."""

    def _on_user_command(self, cmd: UserCommand) -> None:
        if cmd.request_id in self.taken:  # handed again (a taker died, a client resent it)
            logger.info("session %s: the user's %s %s is in the log already; answered, "
                        "not carried out again", self.session_id, cmd.command, cmd.request_id)
            self._out.append(Answer(cmd.request_id, None, self.taken[cmd.request_id]))
            return
        self.command_id = cmd.request_id
        try:
            error = self._carry_out(cmd)
        finally:
            self.command_id = None  # a refused command appended nothing
        answer = Answer(cmd.request_id, error, self.view.last_seq)
        if cmd.command == "stop":
            self._answer_stop(answer)  # once the sandbox has ended
        else:
            self._out.append(answer)

    def _carry_out(self, cmd: UserCommand) -> str | None:
        return {
            "send": self._cmd_send,
            "pause": self._cmd_pause,
            "resume": self._cmd_resume,
            "stop": self._cmd_stop,
            "approve": self._cmd_answer,
            "reject": self._cmd_answer,
            "budget": self._cmd_budget,
        }[cmd.command](cmd)

    def _refusal(self, cmd: UserCommand) -> str:
        """Why the table has no row for ``cmd`` in the session's state, in words."""
        state = self.view.state
        return REFUSALS.get((state, cmd.command),
                            f"cannot {cmd.command} a session that is {state.value}")

    def _cmd_send(self, cmd: UserCommand) -> str | None:
        if not cmd.text.strip():
            return "send needs a non-empty message"
        message = MessageEvent(source="user", text=cmd.text)
        if self.view.state == AgentState.RUNNING:  # the session's message_policy decides
            policy = self.config.message_policy
            if policy == "reject":
                return ("the session is running and takes no message while it works "
                        "(message_policy 'reject'): send it once the session waits, or "
                        "pause it first")
            if policy == "interrupt" and self.llm_request is not None:
                self._move(Why.USER_INTERRUPT, "a message from the user interrupted the "
                           "model call", along=[message])
                return None
        # every state takes a message (recorded even where it does not move the session)
        self._move(Why.USER_MESSAGE, "new message from the user", along=[message])
        return None

    def _cmd_pause(self, cmd: UserCommand) -> str | None:
        return None if self._move(Why.USER_PAUSE, "paused by the user") else self._refusal(cmd)

    def _cmd_resume(self, cmd: UserCommand) -> str | None:
        return None if self._move(Why.USER_RESUME, RESUMED_BY_USER) else self._refusal(cmd)

    def _cmd_stop(self, cmd: UserCommand) -> str | None:
        never_run = [
            ObservationEvent(action_id=action_id, outcome=Outcome(
                status="rejected", content=NOT_RUN_STOPPED))
            for action_id in self.view.pending
            if action_id != self.dispatched and action_id not in self.resolve_first]
        if not self._move(Why.USER_STOP, "stopped by the user", along=never_run):
            return self._refusal(cmd)
        return None

    def _cmd_answer(self, cmd: UserCommand) -> str | None:
        """approve (it runs) or reject (recorded ``rejected`` with the reason; the agent
        carries on) the action waiting in confirmation mode."""
        waiting = self.view.awaiting_confirmation
        if waiting is None:
            return f"no action waits for approval (the session is {self.view.state.value})"
        if cmd.action_id and cmd.action_id != waiting.action_id:
            return (f"action {cmd.action_id} is not the one waiting for approval "
                    f"({waiting.action_id}); nothing was {cmd.command}d")
        approved = cmd.command == "approve"
        answer = ConfirmationEvent(action_id=waiting.action_id, approved=approved,
                                   reason=cmd.text)
        if approved:
            self._move(Why.USER_APPROVE, "approved by the user", along=[answer])
        else:
            reason = cmd.text.strip() or "no reason given"
            rejected = ObservationEvent(action_id=waiting.action_id, outcome=Outcome(
                status="rejected", content=f"The user rejected this action: {reason}"))
            self._move(Why.USER_REJECT, f"rejected by the user: {reason}",
                       along=[answer, rejected])
        return None

    def _cmd_budget(self, cmd: UserCommand) -> str | None:
        """Set the budget (``max_cost_usd``, ``max_iterations``) from now on; a session
        paused because one ran out (``on_budget="ask"``) carries on if the new one lasts."""
        try:
            limits = BudgetLimits.model_validate_json(cmd.text or "{}")
        except ValueError as exc:
            return f"budget: {pydantic_text(exc)}"
        if limits.max_cost_usd is None and limits.max_iterations is None:
            return "budget: give max_cost_usd, max_iterations or both"
        event = BudgetChanged(max_cost_usd=limits.max_cost_usd,
                              max_iterations=limits.max_iterations)
        said = ", ".join(f"{name} {value}" for name, value in
                         (("max_cost_usd", limits.max_cost_usd),
                          ("max_iterations", limits.max_iterations)) if value is not None)
        if self.view.state == AgentState.PAUSED and self.view.cause == Why.BUDGET_ASK:
            still = self._budget_spent(limits.max_cost_usd, limits.max_iterations)  # type: ignore[attr-defined]
            if still is not None:
                return f"the budget would still be spent: {still[1]}; nothing was changed"
            self._move(Why.USER_BUDGET, f"budget raised ({said}); carrying on",
                       along=[event])
        else:
            self._append(event)
        return None

    # -- what follows a resume (``Then`` steps of its rows) -------------------------------

    def _skip_cooldown(self) -> None:
        """The user resumed a rate-limited session: its next model call goes through the
        API key's cooldown (the broker's ``lift_cooldown``)."""
        self.lift_cooldown = True

