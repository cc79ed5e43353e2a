"""The bodies of the daemon's requests (a create, a message, an answer, a budget), as
FastAPI reads them, and what a create needs of the daemon that runs it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class CreateSession(BaseModel):
    """``POST /v1/sessions``: the arguments of ``Trouper.start_session``. Fields other
    than these are its options (``max_iterations``, ``confirm``, ``repo``...)."""

    model_config = ConfigDict(extra="allow")

    id: str | None = Field(default=None, description=(
        "A client-chosen session id: the same id with the same body returns the same "
        "session (200); with another body, 409."))
    task: str
    llm: dict[str, Any] = Field(description="model, base_url, api_key (write-only)...")
    runtime: str | dict[str, Any] = "local"
    workspace: str | None = None
    secrets: dict[str, str] = Field(default_factory=dict, description=(
        "Environment variables of the sandbox's shell; write-only, masked everywhere."))
    labels: list[str] = Field(default_factory=list, description=(
        "In a cluster: labels (``gpu=a100``) the daemon that runs the session must have."))


class Message(BaseModel):
    text: str = Field(min_length=1)


class Budget(BaseModel):
    """``budget``: the limits from now on (either, or both)."""

    max_cost_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_iterations: int | None = Field(default=None, gt=0)


class Answer(BaseModel):
    """``approve`` / ``reject``: which action (optional: the one waiting) and why."""

    action_id: str = ""
    reason: str = ""


def needs_of(body: CreateSession) -> list[str]:
    """What a daemon must have to run the session ``body`` asks for (its runtime's kind,
    the labels it names)."""
    from ..cluster.member import runtime_needs

    runtime = body.runtime
    kind = runtime if isinstance(runtime, str) else str(runtime.get("kind", "local"))
    return runtime_needs(kind, body.labels)
