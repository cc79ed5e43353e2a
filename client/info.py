"""What a client tells of a session, the same embedded and through a daemon.

``SessionSummary`` is one row of ``sessions()``; ``SessionInfo`` is a session's
``info()``: its summary and what its log folds into (cost, steps, the action waiting).
``to_json()`` is what the daemon sends (``GET /v1/sessions``, ``GET /v1/sessions/{id}``)
and ``model_validate`` reads it back, so a daemon's client returns the very values the
embedded ``Trouper`` builds from its store.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, field_serializer

from ..config.models import SessionConfig
from ..core.states import TABLE, Target, Why
from ..exceptions import ConfigError
from ..messages.events import ActionEvent, AgentState

if TYPE_CHECKING:
    from ..core.fold import SessionView
    from ..store import SessionRecord


class SessionSummary(BaseModel):
    """One session as a list shows it (``sessions()``), newest first. Masked: the store
    holds it masked, and the daemon masks what it sends."""

    # a newer daemon may send more fields: an older client reads the ones it knows
    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    state: AgentState
    """The state of the latest ``StateChanged`` in the log; LOADING before any."""
    reason: str
    """That state's reason; empty before any."""
    task: str
    model: str
    """The session's litellm model string."""
    runtime: str = "local"
    """Where its sandbox runs: ``local``, ``docker`` or ``remote``."""
    workspace: str
    """The absolute path of the folder the agent works in."""
    created_at: datetime
    """UTC."""
    updated_at: datetime
    """UTC; moved by every event appended."""
    last_seq: int
    """The seq of the latest event; 0 when the log is empty."""
    replaced_by: str | None = None
    """The session that took this one's place in the list (a rewind,
    docs/time-travel.md), or None. A replaced session is listed only when asked for."""

    @classmethod
    def of_record(cls, record: SessionRecord) -> SessionSummary:
        """The summary of a stored session."""
        config = record.config
        return cls(id=record.session_id, state=record.state, reason=record.state_reason,
                   task=config.task, model=config.llm.model, runtime=config.runtime.kind,
                   workspace=config.workspace,
                   created_at=record.created_at, updated_at=record.updated_at,
                   last_seq=record.last_seq, replaced_by=record.replaced_by)

    @field_serializer("created_at", "updated_at", when_used="json")
    def _isoformat(self, value: datetime) -> str:
        return value.isoformat()  # "+00:00", as the API has always written it (not "Z")

    def to_json(self) -> dict[str, Any]:
        """The summary as the daemon's API writes it."""
        return self.model_dump(mode="json")


class SessionInfo(SessionSummary):
    """One session as ``SessionHandle.info()`` reads it: its summary (``state``,
    ``reason`` and ``last_seq`` as below) and its log folded."""

    state: AgentState
    """As ``SessionHandle.state`` reads it: ERROR while a storage fault lasts, else the
    log's latest state."""
    reason: str
    """The storage fault while one lasts, else the reason of the log's latest state."""
    cause: str | None = None
    """What moved the session to its state, for code (``stuck``, ``max_cost``,
    ``user_pause``...: the ``Why`` of the core's table); None for a storage fault or a
    log older than causes."""
    last_seq: int
    """The seq of the latest event."""
    resumes_at: datetime | None
    """When an ERROR or RATE_LIMITED session carries on by itself; None otherwise."""
    fault: str | None
    """Why the session cannot record anything right now (a full disk...), or None."""
    settled: bool
    """It will not move again without the user (docs/api.md, States), and no fault."""
    cost_usd: float
    prompt_tokens: int
    completion_tokens: int
    iterations: int
    """Model calls over the whole log."""
    actions: int
    outcomes: int
    awaiting_confirmation: ActionEvent | None
    """The action waiting for the user's approval, or None."""
    commands: tuple[str, ...] = ()
    """The user's commands that would do something now (of pause, resume, stop, approve,
    reject: the session core's table for its state); ``send`` and ``budget`` are always
    taken."""
    config: SessionConfig
    """The session's config as stored: never the API key nor a runtime's token."""

    @classmethod
    def of(cls, record: SessionRecord, view: SessionView, fault: str | None) -> SessionInfo:
        """What ``record``, its log folded into ``view`` and its ``fault`` say."""
        summary = SessionSummary.of_record(record).model_dump()
        summary.update(
            state=AgentState.ERROR if fault else view.state, reason=fault or view.reason,
            cause=None if fault or view.cause is None else view.cause.value,
            last_seq=max(view.last_seq, record.last_seq), resumes_at=view.resumes_at,
            fault=fault, settled=view.settled and view.last_seq >= record.last_seq and not fault,
            cost_usd=view.cost_usd, prompt_tokens=view.prompt_tokens,
            completion_tokens=view.completion_tokens, iterations=view.total_iterations,
            actions=view.actions, outcomes=view.outcomes,
            awaiting_confirmation=view.awaiting_confirmation, config=record.config)
        summary["commands"] = commands_in(summary["state"], view.awaiting_confirmation)
        return cls(**summary)

    @field_serializer("resumes_at", when_used="json")
    def _resumes_isoformat(self, value: datetime | None) -> str | None:
        return value.isoformat() if value is not None else None

    def to_json(self) -> dict[str, Any]:
        """The session as the daemon's API writes it (``GET /v1/sessions/{id}``)."""
        return self.model_dump(mode="json", exclude={"config": {"llm": {"api_key"}}})


class SessionRow(SessionSummary):
    """One row of the daemon's list (``GET /v1/sessions``): the summary, and what its log
    folds into that a list shows (the daemon keeps each session's fold)."""

    cost_usd: float = 0.0
    iterations: int = 0
    """Model calls over the whole log."""


_COMMAND_CAUSES = {"pause": Why.USER_PAUSE, "resume": Why.USER_RESUME, "stop": Why.USER_STOP}


def commands_in(state: AgentState, waiting: ActionEvent | None) -> tuple[str, ...]:
    """The commands that would move a session in ``state`` (a row of the core's table
    that is no mere "stays"), and approve and reject while an action waits."""
    table = TABLE.get(state, {})
    moving = tuple(name for name, why in _COMMAND_CAUSES.items()
                   if why in table and table[why].to is not Target.STAY)
    return moving + (("approve", "reject") if waiting is not None else ())


def state_filter(state: AgentState | str | None) -> AgentState | None:
    """The state ``sessions(state=...)`` keeps; ConfigError for a name that is none."""
    if state is None:
        return None
    try:
        return AgentState(state)
    except ValueError:
        known = ", ".join(s.value for s in AgentState)
        raise ConfigError(f"state: {state!r} is not a state; one of {known}",
                          field="state") from None


__all__ = ["SessionInfo", "SessionRow", "SessionSummary", "commands_in", "state_filter"]
