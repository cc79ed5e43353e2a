"""The Controller's answers to users: send, pause, resume, stop; and its state changes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from thespian.actors import ActorAddress

from ..fold import RESUMED_BY_USER
from ..messages.events import AgentState, Event, MessageEvent, ObservationEvent, StateChanged
from ..messages.outcomes import Outcome
from ..messages.protocol import Accepted, CancelCompletion, Refused, UserCommand
from .wiring import Relay, RestartRuntime

if TYPE_CHECKING:
    from .controller import Controller

logger = logging.getLogger(__name__)

_RESUMABLE = frozenset(
    {
        AgentState.PAUSED,
        AgentState.ERROR,
        AgentState.STOPPED,
        AgentState.RATE_LIMITED,
        AgentState.AWAITING_USER_INPUT,
        AgentState.AWAITING_USER_CONFIRMATION,
    }
)


class CommandsMixin:
    """User commands for the Controller (mixed into it; ``self`` is a Controller)."""

    def transition(
        self: Controller,
        state: AgentState,
        reason: str = "",
        resumes_at: datetime | None = None,
        along: Sequence[Event] = (),
    ) -> None:
        """Move to ``state``; ``along`` are appended in the same transaction, so a crash
        never leaves their outcomes without the state change they belong to."""
        view = self.view
        if (view.state, view.reason, view.resumes_at) == (state, reason, resumes_at):
            if along:
                self.append(*along)
            return
        logger.info("session %s: %s -> %s (%s)", self.session_id, view.state.value,
                    state.value, reason)
        self.append(*along, StateChanged(state=state, reason=reason, resumes_at=resumes_at))

    def reply(self: Controller, to: ActorAddress | None, request_id: str, seq: int) -> None:
        if to is not None:
            self.send(to, Accepted(request_id=request_id, session_id=self.session_id, seq=seq))

    def on_relay(self: Controller, msg: Relay, sender: ActorAddress) -> None:
        inner: Any = msg.msg
        if not isinstance(inner, UserCommand):
            logger.warning("controller: cannot relay %s", type(inner).__name__)
            return
        error = self.run_command(inner)
        if msg.reply_to is None:
            return
        if error is None:
            answer: Any = Accepted(
                request_id=inner.request_id, session_id=self.session_id, seq=self.view.last_seq)
        else:
            answer = Refused(request_id=inner.request_id, session_id=self.session_id,
                             error="InvalidRequest", message=error)
        self.send(msg.reply_to, answer)

    def run_command(self: Controller, cmd: UserCommand) -> str | None:
        """Apply a user's command; return why it was refused, or None."""
        handler = {
            "send": self.cmd_send,
            "pause": self.cmd_pause,
            "resume": self.cmd_resume,
            "stop": self.cmd_stop,
        }[cmd.command]
        return handler(cmd)

    def cmd_send(self: Controller, cmd: UserCommand) -> str | None:
        if not cmd.text.strip():
            return "send needs a non-empty message"
        self.append(MessageEvent(source="user", text=cmd.text))
        if self.view.state not in (AgentState.PAUSED, AgentState.RUNNING, AgentState.LOADING):
            self.transition(AgentState.RUNNING, "new message from the user")
        self.advance()
        return None

    def cmd_pause(self: Controller, cmd: UserCommand) -> str | None:
        state = self.view.state
        if state in (AgentState.FINISHED, AgentState.STOPPED, AgentState.PAUSED):
            return f"cannot pause a session that is {state.value}"
        self.cancel_model_call()
        self.transition(AgentState.PAUSED, "paused by the user")
        return None

    def cmd_resume(self: Controller, cmd: UserCommand) -> str | None:
        state = self.view.state
        if state == AgentState.FINISHED:
            return "the session is finished; send a message to give it more work"
        if state in (AgentState.RUNNING, AgentState.LOADING):
            return None
        if state not in _RESUMABLE:
            return f"cannot resume a session that is {state.value}"
        self.lift_cooldown = state == AgentState.RATE_LIMITED
        if self.runtime_down:
            self.runtime_down = False
            self.send(self._parent_address, RestartRuntime(reason="resumed by the user"))
        self.transition(AgentState.RUNNING, RESUMED_BY_USER)
        self.advance()
        return None

    def cmd_stop(self: Controller, cmd: UserCommand) -> str | None:
        if self.view.state == AgentState.STOPPED:
            return None
        self.cancel_model_call()
        never_run = [
            ObservationEvent(action_id=action_id, outcome=Outcome(
                status="rejected", content="Not run: the user stopped the session first."))
            for action_id in self.view.pending
            if action_id != self.dispatched and action_id not in self.resolve_first
        ]
        self.transition(AgentState.STOPPED, "stopped by the user", along=never_run)
        return None

    def cancel_model_call(self: Controller) -> None:
        if self.llm_request is not None and self.broker is not None:
            self.send(self.broker, CancelCompletion(
                request_id=self.llm_request.request_id, session_id=self.session_id))
        self.llm_request = None
