"""Everything a session's log stores. Each event has a ``kind`` tag, a per-session
``seq`` (contiguous from 1, assigned by the store), a timestamp, a ``source`` and a
schema version ``v``.

Conversation events (``message``, ``action``, ``observation``) build the agent's prompt;
status events (``state``, ``llm_completed``, ``llm_retry``, ``runtime``) are for clients
only and never reach a prompt (promise I4, docs/promises.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field, TypeAdapter

from ..core.states import AgentState, Why, settled
from .actions import Action
from .base import Frozen
from .mcp import McpTool
from .outcomes import Outcome

SCHEMA_VERSION = 1
Source = Literal["user", "agent", "environment"]


def _now() -> datetime:
    return datetime.now(UTC)


class EventBase(Frozen):
    """Fields every event carries."""

    v: int = SCHEMA_VERSION
    """Schema version of the stored event."""
    seq: int = 0
    """Position in the session's log, from 1; 0 until the store appends it."""
    ts: datetime = Field(default_factory=_now)
    source: Source = "environment"
    is_status: ClassVar[bool] = False
    """Status events are shown to clients and never put into a prompt."""


class CarriesCommand(EventBase):
    """An event a user's command may append first: it names the command, in the same
    append as what the command did, so the log says the command was carried out
    (``core/commands.py``)."""

    command_id: str | None = None
    """The command's ``request_id``: one handed again (its taker died, or a client sent
    it again under its idempotency key) is answered, not carried out twice."""


class MessageEvent(CarriesCommand):
    """Text from the user (the task is the first one) or a text reply of the agent."""

    kind: Literal["message"] = "message"
    text: str


class ActionEvent(EventBase):
    """The agent's intent, durable before the action is dispatched (promise I2)."""

    kind: Literal["action"] = "action"
    source: Source = "agent"
    action_id: str
    turn_id: str
    """Groups the tool calls of one model response."""
    tool_call_id: str
    """The id the model gave this call; the outcome answers it in the prompt."""
    tool: str
    """The tool name as the model sent it (may be unknown when ``action`` is None)."""
    arguments: str
    """The raw JSON arguments as the model sent them."""
    action: Action | None = None
    """The parsed action; ``None`` when the call was malformed (its outcome says why)."""
    thought: str = ""
    """Text the model sent alongside its tool calls (set on the first call of a turn)."""


class ObservationEvent(EventBase):
    """The one outcome of an action (promise I1)."""

    kind: Literal["observation"] = "observation"
    action_id: str
    outcome: Outcome


class ConfirmationEvent(CarriesCommand):
    """The user's answer to an action that waited for approval (confirmation mode). A
    rejection reaches the agent as the action's ``rejected`` outcome, so this event is a
    status event: never in the prompt."""

    kind: Literal["confirmation"] = "confirmation"
    is_status: ClassVar[bool] = True
    source: Source = "user"
    action_id: str
    approved: bool
    reason: str = ""


class StateChanged(CarriesCommand):
    """The session moved to ``state``."""

    kind: Literal["state"] = "state"
    is_status: ClassVar[bool] = True
    state: AgentState
    reason: str = ""
    """In words, for people."""
    cause: Why | None = None
    """The transition, for code (None in logs older than the field)."""
    resumes_at: datetime | None = None
    """When the session resumes by itself (RATE_LIMITED, or an ERROR being recovered);
    ``None`` means it waits for the user."""

    @property
    def settled(self) -> bool:
        """True when the session will not move again without the user."""
        return settled(self.state, self.resumes_at)


class LLMCompleted(EventBase):
    """One model call answered: its tokens, cost and latency."""

    kind: Literal["llm_completed"] = "llm_completed"
    is_status: ClassVar[bool] = True
    request_id: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    attempts: int = 1


class LLMRetry(EventBase):
    """A model call failed and will be tried again (shown live; never prompted)."""

    kind: Literal["llm_retry"] = "llm_retry"
    is_status: ClassVar[bool] = True
    request_id: str
    model: str = ""
    """The model the next attempt goes to (a fallback model when it changed)."""
    attempt: int
    """The attempt about to be made (2 for the first retry)."""
    max_attempts: int
    wait_s: float
    error_class: str
    message: str


class RuntimeEvent(EventBase):
    """The sandbox started, re-attached, restarted or failed."""

    kind: Literal["runtime"] = "runtime"
    is_status: ClassVar[bool] = True
    phase: Literal["started", "attached", "restarted", "failed", "closed", "starting"]
    """``starting``: a step of a start the backend reported (``detail`` says which)."""
    epoch: int = 0
    detail: str = ""


class PromptCondensed(EventBase):
    """The prompt outgrew the context window: messages before ``cut`` are left out of it
    from now on (the log keeps them all)."""

    kind: Literal["prompt_condensed"] = "prompt_condensed"
    is_status: ClassVar[bool] = True
    cut: int
    """Index into the full prompt's messages; the system message and task are always kept."""
    dropped: int
    reason: str = ""
    summary: str = ""
    """What the dropped messages said, as the model summarized them (the summarizing
    condenser); empty for a plain cut. The prompt shows it in their place."""


class BudgetChanged(CarriesCommand):
    """The user set a session's budget: from now on its limits, in place of the config's
    (None keeps the one in force)."""

    kind: Literal["budget"] = "budget"
    is_status: ClassVar[bool] = True
    source: Source = "user"
    max_cost_usd: float | None = None
    max_iterations: int | None = None


class McpToolsListed(EventBase):
    """The session's MCP servers started and listed their tools (its last setup step).
    From now on the model is offered ``tools`` beside trouper's own: a restart offers the
    same, from the log, without listing them again."""

    kind: Literal["mcp_tools"] = "mcp_tools"
    is_status: ClassVar[bool] = True
    action_id: str
    """The setup step that listed them."""
    tools: tuple[McpTool, ...] = ()
    failed: dict[str, str] = Field(default_factory=dict)
    """Servers that did not start -> why (their tools are not offered)."""


class SessionForked(EventBase):
    """This session is a fork: its events 1..``at_seq`` are copies of ``from_session``'s
    (``client/fork.py``), and its workspace was made as ``files`` says."""

    kind: Literal["forked"] = "forked"
    is_status: ClassVar[bool] = True
    source: Source = "user"
    from_session: str
    at_seq: int
    checkpoint: str | None = None
    """The snapshot its workspace was restored from; None: ``files`` says what it holds."""
    files: str = ""


Event = Annotated[
    MessageEvent
    | ActionEvent
    | ObservationEvent
    | StateChanged
    | LLMCompleted
    | LLMRetry
    | RuntimeEvent
    | PromptCondensed
    | ConfirmationEvent
    | BudgetChanged
    | McpToolsListed
    | SessionForked,
    Field(discriminator="kind"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def event_from_json(data: str | bytes) -> Event:
    """Parse one stored event."""
    return EVENT_ADAPTER.validate_json(data)
