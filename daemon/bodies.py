"""The bodies of the daemon's requests (a create, a message, an answer, a budget), as
FastAPI reads them, and what a create needs of the daemon that runs it."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from ..messages.mcp import McpServer


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
    mcp: list[McpServer] | None = Field(default=None, description=(
        "MCP servers whose tools the agent may call: each a stdio ``command`` (started in "
        "the sandbox) or an HTTP ``url``; secrets in ``env``/``headers`` as "
        "``<secret:NAME>``, NAME one of ``secrets``."))

    @field_validator("mcp")
    @classmethod
    def _mcp_secrets_given(cls, value: list[McpServer] | None,
                           info: ValidationInfo) -> list[McpServer] | None:
        # checked here too so that the 422 names the field (the session's own check does
        # too, without a field)
        given = set(info.data.get("secrets") or {})
        for server in value or []:
            if missing := sorted(server.secret_names() - given):
                raise ValueError(f"the MCP server {server.label!r} names secrets the session "
                                 f"is not given: {', '.join(missing)} (give them in secrets)")
        return value

    @model_serializer(mode="wrap")
    def _mcp_only_when_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a create without servers reads as it did before the field (its digest, the
        # options start_session is given), so a create sent again still matches
        data: dict[str, Any] = handler(self)
        if data.get("mcp") is None:
            data.pop("mcp", None)
        else:
            data["mcp"] = [{k: v for k, v in server.items() if v is not None}
                           for server in data["mcp"]]
        return data


class Message(BaseModel):
    text: str = Field(min_length=1)


class Budget(BaseModel):
    """``budget``: the limits from now on (either, or both)."""

    max_cost_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_iterations: int | None = Field(default=None, gt=0)


class ForkBody(BaseModel):
    """``fork`` and ``rewind``: at which event (None: the last) and, optionally, the hint
    it carries on with (without one the fork waits PAUSED)."""

    at_seq: int | None = Field(default=None, ge=1)
    message: str | None = None
    llm: dict[str, Any] | None = None
    """The fork's model settings, in place of the original's (its key kept unless
    these give one)."""
    workspace: str | None = None
    """The fork's folder (absolute, on the daemon's machine); default its own."""


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
