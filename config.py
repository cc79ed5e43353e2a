"""Configuration models. Unknown fields are errors, so a typo never becomes a default."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from .text import storable


class Config(BaseModel):
    """Base for configuration: frozen, and unknown fields are rejected. Its text is
    storable (lone surrogates become U+FFFD), like every message's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        return storable(data)


class LLMConfig(Config):
    """How a session reaches its model. Every call goes through litellm."""

    model: str
    """A litellm model string, e.g. ``"openai/gpt-4o"`` or ``"hosted_vllm/my-model"``."""
    base_url: str | None = None
    """The API base; ``None`` uses the provider's default."""
    api_key: SecretStr | None = None
    """Kept out of the event store; ``None`` lets litellm read the provider's env var."""
    temperature: float | None = None
    max_output_tokens: int | None = None
    timeout_s: float = 120.0
    """Limit for one HTTP call to the provider."""
    num_retries: int = 4
    """Retries after the first attempt for errors a retry can fix; 0 never retries."""
    retry_min_wait_s: float = 1.0
    retry_max_wait_s: float = 60.0
    """Cap on one wait between attempts."""
    retry_total_s: float = 300.0
    """Cap on all waits of one call together."""
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute allowed on this key and model; ``None`` means no limit."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute allowed on this key and model; ``None`` means no limit."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Calls in flight at once on this key and model; ``None`` means no limit."""
    input_cost_per_token: float | None = None
    """Price used when litellm does not know the model; ``None`` counts it as free."""
    output_cost_per_token: float | None = None
    fallbacks: list[str] = Field(default_factory=list)
    """Models tried in order after the primary's retries are spent."""


class SessionConfig(Config):
    """Everything that defines a session; stored with it (secrets excluded)."""

    task: str
    llm: LLMConfig
    runtime: Literal["local"] = "local"
    workspace: str
    """Absolute path of the folder the agent works in."""
    max_iterations: int = 50
    """Model calls allowed before the session is STOPPED."""
    max_cost_usd: float | None = None
    """Spend allowed before the session is STOPPED; ``None`` means no limit."""
    command_timeout_s: float = 120.0
    """Hard limit for one command: its process group is killed after it."""
    no_output_timeout_s: float = 30.0
    """Soft limit: after this long with no new output the agent gets control back."""
    max_consecutive_timeouts: int = 3
    """Hard timeouts in a row after which the session is PAUSED (the breaker); 0 never."""
    resume_after_runtime_restart: bool = True
    """After the sandbox was restarted and in-flight actions resolved, go back to RUNNING by
    itself; False leaves the session in ERROR until the user resumes it."""
    max_output_chars: int = 10_000
    """Output longer than this keeps its head and tail; the full text goes to a file."""
    secret_names: tuple[str, ...] = ()
    """Names of the secrets given to the runtime as environment variables."""
    system_prompt: str | None = None
    """Replaces the default agent's system prompt; ``None`` keeps it."""
