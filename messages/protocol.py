"""Messages actors exchange. Requests are imperatives, replies are facts.

Every request carries the id its reply echoes, so a caller can match answers to
questions even after restarts or timeouts.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from ..config.models import LLMConfig, SessionConfig
from .actions import RuntimeAction
from .base import Frozen
from .causes import RuntimeFailure
from .checkpoints import CheckpointPolicy
from .outcomes import Outcome


class Refusal(StrEnum):
    """Why a request was not taken; the program raises the matching exception."""

    UNKNOWN_SESSION = "UnknownSession"
    """No live session with that id in this actor system (``UnknownSession``)."""
    INVALID_REQUEST = "InvalidRequest"
    """The session cannot take it now: its state, a storage fault (``InvalidRequest``)."""


# ---- user commands (API -> RootSupervisor -> SessionSupervisor -> Controller) ----


class StartSession(Frozen):
    kind: Literal["start_session"] = "start_session"
    request_id: str
    session_id: str
    config: SessionConfig
    secrets: dict[str, str] = Field(default_factory=dict)
    home: str
    """The trouper home: the session's folders (runtime state, secrets, pid files)."""
    store_url: str
    """Where the session's log is (``sqlite:///...``): actors open the store by it."""
    restore: bool = False
    """True when the session already has a log to carry on from."""


class UserCommand(Frozen):
    """A user's command for one session."""

    kind: Literal["user_command"] = "user_command"
    request_id: str
    session_id: str
    command: Literal["send", "pause", "resume", "stop", "approve", "reject", "budget"]
    text: str = ""
    """The message, for ``send``; the reason, for ``reject``; for ``budget``, the new
    limits as JSON (``{"max_cost_usd": 2.0, "max_iterations": 80}``, either may be
    missing)."""
    action_id: str = ""
    """For ``approve`` and ``reject``: the action the user saw waiting ("": whichever
    waits). Another action waiting now is refused, never approved in its place."""


class Accepted(Frozen):
    """The request was taken; ``seq`` is the last event it appended (0 if none)."""

    kind: Literal["accepted"] = "accepted"
    request_id: str
    session_id: str
    seq: int = 0


class Refused(Frozen):
    """The request was not taken, with the reason (unknown session, wrong state...)."""

    kind: Literal["refused"] = "refused"
    request_id: str
    session_id: str = ""
    error: Refusal
    message: str


# ---- LLM (Controller <-> LLMBroker) ----


class Complete(Frozen):
    kind: Literal["complete"] = "complete"
    request_id: str
    session_id: str
    llm: LLMConfig
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    turn: int = 0
    """Model turns the session had before this one (sent as ``X-Trouper-Turn``)."""
    lift_cooldown: bool = False
    """The user resumed a RATE_LIMITED session: try now, ending the key's cooldown."""
    history_id: str = ""
    """Names the history ``messages`` belong to (``llm/history.py``); "" for none."""
    history_len: int = 0
    """0: ``messages`` and ``tools`` are whole. Else ``messages`` follow the first
    ``history_len`` of history ``history_id``, which the broker keeps, with its tools."""
    trace: dict[str, str] | None = None
    """The session turn's trace context (a W3C ``traceparent``) when tracing is on
    (``observability/tracing.py``); None otherwise."""


class ToolCall(Frozen):
    id: str
    name: str
    arguments: str
    """Raw JSON text, as the model sent it."""


class Completed(Frozen):
    kind: Literal["completed"] = "completed"
    request_id: str
    session_id: str
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    attempts: int = 1


LLMErrorClass = Literal[
    "rate_limit", "transient", "context_window", "auth", "bad_request", "malformed", "unknown"
]


class CompletionFailed(Frozen):
    kind: Literal["completion_failed"] = "completion_failed"
    request_id: str
    session_id: str
    error_class: LLMErrorClass
    message: str
    retry_after_s: float | None = None
    attempts: int = 1


class RetryScheduled(Frozen):
    """The broker will try a call again (the Controller records an LLMRetry event)."""

    kind: Literal["retry_scheduled"] = "retry_scheduled"
    request_id: str
    session_id: str
    model: str = ""
    """The model of the next attempt."""
    attempt: int
    max_attempts: int
    wait_s: float
    error_class: LLMErrorClass
    message: str


class ResendHistory(Frozen):
    """Broker -> Controller: a ``Complete`` built on a history the broker does not have
    (it restarted, or forgot the session): send it whole."""

    kind: Literal["resend_history"] = "resend_history"
    request_id: str
    session_id: str


class CancelCompletion(Frozen):
    kind: Literal["cancel_completion"] = "cancel_completion"
    request_id: str
    session_id: str


# ---- Runtime (Controller <-> RuntimeProxy) ----


class Execute(Frozen):
    kind: Literal["execute"] = "execute"
    session_id: str
    action_id: str
    action: RuntimeAction
    timeout_s: float
    """Hard limit."""
    no_output_timeout_s: float
    """Soft limit."""
    checkpoint: CheckpointPolicy | None = None
    """Snapshot the workspace once the action ended (``runtimes/sandbox/checkpoints.py``);
    the outcome then names the snapshot."""
    trace: dict[str, str] | None = None
    """The session turn's trace context, as in ``Complete``; None when tracing is off."""


class Executed(Frozen):
    kind: Literal["executed"] = "executed"
    session_id: str
    action_id: str
    outcome: Outcome


class ResolveAction(Frozen):
    """Ask the runtime's journal what became of an action (never re-runs it)."""

    kind: Literal["resolve_action"] = "resolve_action"
    session_id: str
    action_id: str


class RuntimeFailed(Frozen):
    """The sandbox itself failed: a supervisor must act (not the agent)."""

    kind: Literal["runtime_failed"] = "runtime_failed"
    session_id: str
    epoch: int
    cause: RuntimeFailure
    detail: str
    error_class: str = ""
    """Class path of the exception, when one was raised."""
    traceback: str = ""


class RuntimeReady(Frozen):
    kind: Literal["runtime_ready"] = "runtime_ready"
    session_id: str
    epoch: int
    attached: bool
    """True when an existing sandbox was re-attached rather than started anew."""


class RuntimeProgress(Frozen):
    """A step of a sandbox's start, as its backend reports it (the docker runtime: image,
    pull, create, start, replace, ready), so a slow start is never a silent wait. From the
    RuntimeProxy to its supervisor; meant to reach the log as ``RuntimeEvent(phase=
    "starting", detail="<phase>: <detail>")``."""

    kind: Literal["runtime_progress"] = "runtime_progress"
    session_id: str
    phase: str
    detail: str = ""





class Resolved(Frozen):
    """The journal's answer to ``ResolveAction``."""

    kind: Literal["resolved"] = "resolved"
    session_id: str
    action_id: str
    state: Literal["absent", "running", "finished", "unknown"]
    outcome: Outcome | None = None


class CloseSandbox(Frozen):
    """Stop the sandbox for good (the session is being closed or deleted)."""

    kind: Literal["close_sandbox"] = "close_sandbox"
    request_id: str


class SandboxClosed(Frozen):
    kind: Literal["sandbox_closed"] = "sandbox_closed"
    request_id: str
    session_id: str


class StoreFault(Frozen):
    """Controller -> up the tree: the session cannot record anything now (or, with
    ``cause`` None, can again). Clients see it while the log cannot say it."""

    kind: Literal["store_fault"] = "store_fault"
    session_id: str
    cause: str | None
    """What failed, for the user ("the disk holding the home is full (...)"); None: over."""
    since: datetime | None = None


class FaultQuery(Frozen):
    """Program -> root: is this session stopped by a storage fault right now?"""

    kind: Literal["fault_query"] = "fault_query"
    request_id: str
    session_id: str


class FaultStatus(Frozen):
    """Root -> program: the answer to ``FaultQuery``."""

    kind: Literal["fault_status"] = "fault_status"
    request_id: str
    session_id: str
    cause: str | None = None
    since: datetime | None = None


class JournalFault(Frozen):
    """RuntimeProxy -> Controller: the sandbox cannot journal an action now, so it is not
    run (``cause``), or can again (``cause`` None); the proxy keeps trying it."""

    kind: Literal["journal_fault"] = "journal_fault"
    session_id: str
    action_id: str
    cause: str | None
