"""A session's state as a fold over its event log (promise I3, docs/promises.md).

The Controller keeps one ``SessionView`` up to date as it appends; a restarted Controller,
a reopened ``Trouper`` or a client rebuilds the same view by replaying the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from ..messages.events import (
    ActionEvent,
    AgentState,
    BudgetChanged,
    ConfirmationEvent,
    Event,
    LLMCompleted,
    McpToolsListed,
    MessageEvent,
    ObservationEvent,
    SessionForked,
    StateChanged,
    Why,
)
from ..messages.mcp import McpTool

RESUMED_BY_USER = "resumed by the user"
"""The reason of a user's resume; logs written before ``StateChanged.cause`` existed are
read by it (a resume opens a new iteration budget)."""


@dataclass
class SessionView:
    """What the log says about a session, updated one event at a time."""

    state: AgentState = AgentState.LOADING
    reason: str = ""
    cause: Why | None = None
    """What moved the session to its state (``StateChanged.cause``; None in old logs)."""
    resumes_at: datetime | None = None
    last_seq: int = 0
    iterations: int = 0
    """Model calls since the last user message or user resume (``max_iterations`` caps it)."""
    total_iterations: int = 0
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    consecutive_timeouts: int = 0
    pending: dict[str, ActionEvent] = field(default_factory=dict)
    """Actions without an outcome, in log order."""
    outcomes: int = 0
    actions: int = 0
    approved: set[str] = field(default_factory=set)
    """Actions the user approved (confirmation mode) that have no outcome yet."""
    max_cost_usd: float | None = None
    """The budget the user set last (``BudgetChanged``); None: the config's."""
    max_iterations: int | None = None
    """As ``max_cost_usd``, for model calls."""
    forked_from: tuple[str, int] | None = None
    """The session and event this one was forked from (``SessionForked``); None."""
    mcp_tools: dict[str, McpTool] = field(default_factory=dict)
    """The MCP servers' tools the model is offered (``McpToolsListed``), by offered name."""
    before_store_fault: tuple[AgentState, str, datetime | None] | None = None
    """Where the session was before the store-fault records that end its log (a shared
    store may keep a record whose writer heard a failure, and the fault is then recorded
    again); None when its last state change is not a store fault."""

    @classmethod
    def of(cls, events: Iterable[Event]) -> SessionView:
        view = cls()
        for event in events:
            view.apply(event)
        return view

    @property
    def awaiting_confirmation(self) -> ActionEvent | None:
        """The action waiting for the user's approval, if the session waits for one."""
        if self.state != AgentState.AWAITING_USER_CONFIRMATION:
            return None
        return next((e for e in self.pending.values() if e.action_id not in self.approved),
                    None)

    @property
    def settled(self) -> bool:
        return StateChanged(state=self.state, resumes_at=self.resumes_at).settled

    def apply(self, event: Event) -> None:
        """Fold one event in."""
        self.last_seq = max(self.last_seq, event.seq)
        if isinstance(event, StateChanged):
            self._apply_state(event)
        elif isinstance(event, LLMCompleted):
            self.iterations += 1
            self.total_iterations += 1
            self.cost_usd += event.cost_usd
            self.prompt_tokens += event.prompt_tokens
            self.completion_tokens += event.completion_tokens
        elif isinstance(event, ActionEvent):
            self.actions += 1
            self.pending[event.action_id] = event
        elif isinstance(event, ObservationEvent):
            self._apply_outcome(event)
        elif isinstance(event, MessageEvent) and event.source == "user":
            self.iterations = 0
        elif isinstance(event, ConfirmationEvent) and event.approved:
            self.approved.add(event.action_id)
        elif isinstance(event, BudgetChanged):
            if event.max_cost_usd is not None:
                self.max_cost_usd = event.max_cost_usd
            if event.max_iterations is not None:
                self.max_iterations = event.max_iterations
        elif isinstance(event, SessionForked):
            self.forked_from = (event.from_session, event.at_seq)
        elif isinstance(event, McpToolsListed):
            self.mcp_tools = {tool.name: tool for tool in event.tools}

    def _apply_state(self, event: StateChanged) -> None:
        if event.cause != Why.STORE_FAULT:
            self.before_store_fault = None
        elif self.before_store_fault is None:
            self.before_store_fault = (self.state, self.reason, self.resumes_at)
        self.state = event.state
        self.reason = event.reason
        self.cause = event.cause
        self.resumes_at = event.resumes_at
        if event.cause == Why.USER_RESUME or (event.cause is None
                                              and event.reason == RESUMED_BY_USER):
            self.iterations = 0
            self.consecutive_timeouts = 0

    def _apply_outcome(self, event: ObservationEvent) -> None:
        self.outcomes += 1
        self.pending.pop(event.action_id, None)
        self.approved.discard(event.action_id)
        if event.outcome.timed_out == "hard":  # a quiet command still running is no fault
            self.consecutive_timeouts += 1
        else:
            self.consecutive_timeouts = 0
