"""Configuration models: everything a session is given. Unknown fields are errors, so a
typo never becomes a default.

The models are the single source of truth for what a value may be (``gt=0`` and the
like); ``config_check.session_config`` checks what ``start_session`` is given against
them and turns pydantic's errors into one ``ConfigError`` whose message reads
``field: reason``. It quotes a refused value only when its type was wrong, whole, for the
caller to mask (it may be a secret); never a secret's value.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..messages.base import Frozen
from ..messages.checkpoints import CheckpointPolicy
from ..messages.mcp import McpServer, named
from ..messages.text import storable
from ..runtimes.sandbox.owners import checked_user
from .confirmation import ConfirmationPolicy


class Config(BaseModel):
    """Base for configuration: frozen, and unknown fields are rejected. Its text is
    storable (lone surrogates become U+FFFD), like every message's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        return storable(data)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


_USERINFO = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#@]*@", re.I)
"""A URL whose authority carries ``user[:password]@``."""


def _http_url(value: str | None) -> str | None:
    # without a scheme httpx fails on every call, which reads as a transient error and
    # would be retried for minutes
    if value is not None and not value.lower().startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    if value is not None and _USERINFO.match(value):  # the URL is stored with the session
        raise ValueError("must not carry credentials (user:password@): they would be "
                         "stored with the session; give the key as api_key or token")
    return value


class LLMConfig(Config):
    """How a session reaches its model. Every call goes through litellm."""

    model: str
    """A litellm model string, e.g. ``"openai/gpt-4o"`` or ``"hosted_vllm/my-model"``."""
    base_url: str | None = None
    """The API base (``http://`` or ``https://``); ``None`` uses the provider's default."""
    api_key: SecretStr | None = None
    """Kept out of the event store; ``None`` lets litellm read the provider's env var."""
    temperature: float | None = Field(default=None, ge=0)
    max_output_tokens: int | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=120.0, gt=0)
    """Limit for one HTTP call to the provider."""
    num_retries: int = Field(default=4, ge=0)
    """Retries after the first attempt for errors a retry can fix; 0 never retries."""
    retry_min_wait_s: float = Field(default=1.0, ge=0)
    retry_max_wait_s: float = Field(default=60.0, ge=0)
    """Cap on one wait between attempts."""
    retry_total_s: float = Field(default=300.0, ge=0)
    """Cap on all waits of one call together."""
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute allowed on this key and model; ``None`` means no limit."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute allowed on this key and model; ``None`` means no limit."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Calls in flight at once on this key and model; ``None`` means no limit."""
    input_cost_per_token: float | None = Field(default=None, ge=0)
    """Price used when litellm does not know the model; ``None`` counts it as free."""
    output_cost_per_token: float | None = Field(default=None, ge=0)
    fallbacks: list[Annotated[str, AfterValidator(_not_blank)]] = Field(default_factory=list)
    """Models tried in order after the primary's retries are spent."""

    _model_given = field_validator("model")(_not_blank)

    _base_url_http = field_validator("base_url")(_http_url)


class LocalRuntime(Config):
    """The sandbox is a server process on this machine whose shell runs as you, confined by
    the kernel where it can be (Landlock, seccomp): it writes only the workspace and the
    temporary folders and cannot read the trouper home or your credential stores. The
    default. See docs/runtimes.md and docs/security.md."""

    kind: Literal["local"] = "local"
    confine: bool = True
    """Confine the shell (the default). ``False`` runs it with all your rights, as a
    program you start yourself: only for a workspace and a model you trust entirely."""
    network: bool = True
    """Whether the shell may open network sockets (TCP, UDP); ``False`` leaves it Unix
    sockets only. Needs ``confine``."""
    unreadable: tuple[str, ...] = ()
    """More files or folders the shell may neither read nor write, beside the trouper home
    and the usual credential stores (``~/.ssh``, ``~/.aws``...: docs/runtimes.md)."""
    writable: tuple[str, ...] = ()
    """More folders the shell may write, beside the workspace and the temporary folders
    (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``$TMPDIR``): a package cache, say."""

    @field_validator("unreadable", "writable")
    @classmethod
    def _absolute_paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not os.path.isabs(os.path.expanduser(path)):
                raise ValueError(f"{path!r} is not an absolute path")
        return tuple(os.path.expanduser(path) for path in value)

    @model_validator(mode="after")
    def _network_needs_confine(self) -> LocalRuntime:
        if not self.network and not self.confine:
            raise ValueError("network=False needs confine=True (the network is cut by the "
                             "confinement)")
        return self


class DockerRuntime(Config):
    """The sandbox is a container started from ``image`` (any image with a POSIX ``sh``):
    one per session, the workspace bind-mounted, every capability dropped. See
    docs/runtimes.md."""

    kind: Literal["docker"] = "docker"
    image: str
    """The image to run, found locally (trouper pulls it only when it is missing)."""
    network: str = "none"
    """Docker network mode: ``"none"`` (the default: no network), ``"bridge"`` or a named
    network. ``"host"`` is refused: it would let the agent reach loopback services."""
    memory: str = "2g"
    """Memory limit, in Docker's units (``"512m"``, ``"2g"``)."""
    cpus: float = Field(default=2.0, gt=0)
    pids_limit: int = Field(default=512, gt=0)
    user: str | None = None
    """Numeric ``uid[:gid]`` the shell runs as (gid: the uid), never 0 nor a name. ``None``:
    yours; when trouper is root, the workspace owner's or ``TROUPER_SANDBOX_UID``, never
    root (docs/runtimes.md)."""
    workdir: str = "/workspace"
    """Where the workspace is mounted inside the container."""
    keep: bool = False
    """Keep the container when the session stops (it is removed by default)."""
    start_timeout_s: float = Field(default=120.0, gt=0)
    """Limit for finding the image, creating and starting the container."""

    _user_numeric = field_validator("user")(checked_user)

    @field_validator("network")
    @classmethod
    def _not_host(cls, value: str) -> str:
        if value == "host" or value.startswith("container:"):
            raise ValueError("host and container: network modes would let the sandbox "
                             "reach this machine's loopback services")
        return value

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must be an absolute path inside the container")
        return value


class RemoteRuntime(Config):
    """The sandbox is a runtime server (``trouper runtime-server``) elsewhere, reached at
    ``url`` with a bearer token: ``token`` itself (kept with the session's secrets, never
    in the store) or the environment variable ``token_env``."""

    kind: Literal["remote"] = "remote"
    url: str
    token: SecretStr | None = None
    token_env: str = "TROUPER_RUNTIME_TOKEN"
    verify: bool | str = True
    """TLS verification: True, False, or the path of a CA bundle."""
    ready_timeout_s: float = Field(default=60.0, gt=0)
    """How long to wait for the server to answer healthy before the start fails."""

    _url_http = field_validator("url")(_http_url)


RuntimeConfig = Annotated[LocalRuntime | DockerRuntime | RemoteRuntime,
                          Field(discriminator="kind")]
"""Where a session's sandbox runs; ``"local"`` (a name alone) is read as ``LocalRuntime()``."""

_RUNTIME_ADAPTER: TypeAdapter[Any] = TypeAdapter(RuntimeConfig)
"""Built once: building it is a schema generation, about 1.4 ms of each check."""


def _runtime_by_name(value: Any) -> Any:
    """A runtime given by name (and stored so before runtimes were typed) is its config."""
    return {"kind": value} if isinstance(value, str) else value


class StuckPolicy(Frozen):
    """When the agent counts as stuck (``core/stuck.py``): the session is then PAUSED with
    cause ``stuck`` and a reason naming the pattern and the actions. ``False`` turns the
    detection off, ``True`` or ``{}`` takes the defaults."""

    enabled: bool = True
    repeat: int = Field(default=4, ge=2)
    """The same action with the same outcome, this many times in a row."""
    error_repeat: int = Field(default=3, ge=2)
    """The same action failing with the same error, this many times in a row."""
    alternate: int = Field(default=6, ge=4)
    """Two actions and their outcomes taking turns, this many actions long."""
    think: int = Field(default=6, ge=2)
    """``think`` actions and nothing else, this many in a row."""
    condense: int = Field(default=3, ge=1)
    """Condensations of the prompt with no action in between."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value


class SessionConfig(Config):
    """Everything that defines a session; stored with it (secrets excluded)."""

    task: str
    """What the agent is asked to do; must hold more than whitespace."""
    llm: LLMConfig
    runtime: RuntimeConfig = LocalRuntime()
    workspace: str
    """Absolute path of the folder the agent works in."""
    max_iterations: int = Field(default=50, gt=0)
    """Model calls allowed before the session is STOPPED."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """Spend allowed before the session is STOPPED; ``None`` means no limit."""
    command_timeout_s: float = Field(default=120.0, gt=0)
    """Hard limit for one command: its process group is killed after it."""
    no_output_timeout_s: float = Field(default=30.0, gt=0)
    """Soft limit: after this long with no new output the agent gets control back."""
    max_consecutive_timeouts: int = Field(default=3, ge=0)
    """Hard timeouts in a row after which the session is PAUSED (the breaker); 0 never."""
    resume_after_runtime_restart: bool = True
    """After the sandbox was restarted and in-flight actions resolved, go back to RUNNING by
    itself; False leaves the session in ERROR until the user resumes it."""
    max_output_chars: int = Field(default=10_000, gt=0)
    """Output longer than this keeps its head and tail; the full text goes to a file."""
    secret_names: tuple[str, ...] = ()
    """Names of the secrets given to the runtime as environment variables."""
    system_prompt: str | None = None
    """Replaces the default agent's system prompt; ``None`` keeps it."""
    repo: str | None = None
    """A git repository cloned into the (empty) workspace before the first step: a URL, or
    a path on the machine the sandbox runs on. Credentials never go in the URL (they would
    be stored): use git's credential helpers or ssh keys where the sandbox runs."""
    branch: str | None = None
    """The branch or tag of ``repo`` to check out; ``None`` takes its default branch."""
    setup: str | None = None
    """A shell script run in the sandbox after the clone and before the first step (one
    command line; its output is an event). A failure ends the session in ERROR naming it."""
    setup_timeout_s: float = Field(default=1800.0, gt=0)
    """Hard limit for the clone and for the setup script, each."""
    confirm: ConfirmationPolicy = ConfirmationPolicy()
    """Confirmation mode: which actions wait for the user's approval (default: none)."""
    message_policy: Literal["queue", "interrupt", "reject"] = "queue"
    """A message sent while the session is RUNNING: ``queue`` (recorded and read by the
    agent at its next turn), ``interrupt`` (the model call in flight is cancelled and
    asked again with the message; a command running in the sandbox goes on), or
    ``reject`` (refused, naming the state; nothing recorded)."""
    condenser: Literal["cut", "summarize"] = "cut"
    """How a long session's prompt is kept within the context window: ``cut`` drops the
    older half when the model refuses it as too long; ``summarize`` asks a model for a
    summary of the older half once the prompt passes ``summarize_at_tokens``, before
    it is too long (and still cuts on an overflow)."""
    summarize_at_tokens: int = Field(default=60_000, gt=0)
    """For ``summarize``: the prompt's estimated tokens (4 characters each) past which
    its older half is summarized."""
    summary_model: str | None = None
    """For ``summarize``: a cheaper model of the same provider to write summaries (its
    ``llm`` settings otherwise); None: the session's model."""
    on_budget: Literal["stop", "ask"] = "stop"
    """When ``max_cost_usd`` or ``max_iterations`` runs out: ``stop`` the session, or
    ``ask``: PAUSE it saying which budget ran out and by how much, until the user raises
    it (``Session.budget``) or stops it."""
    stuck: StuckPolicy = StuckPolicy()
    """Stuck detection: which loops pause the session (default on; ``False`` off)."""
    checkpoints: CheckpointPolicy = CheckpointPolicy()
    """Snapshot the workspace after every action that may change it, outside it (the
    sandbox's checkpoint store): what a fork or a rewind at that action starts from."""
    mcp: tuple[McpServer, ...] = ()
    """MCP servers whose tools the agent is offered beside trouper's own: a stdio
    ``command`` started inside the sandbox, or a streamable HTTP ``url``
    (``messages/mcp.py``). Each is named (from its program or host when not given)."""

    _task_given = field_validator("task")(_not_blank)

    @field_validator("mcp")
    @classmethod
    def _mcp_named(cls, value: tuple[McpServer, ...],
                   info: ValidationInfo) -> tuple[McpServer, ...]:
        servers = named(value)
        given = set(info.data.get("secret_names") or ())  # declared before mcp: checked first
        for server in servers:
            missing = sorted(server.secret_names() - given)
            if missing:
                raise ValueError(f"the MCP server {server.name!r} names secrets the session "
                                 f"is not given: {', '.join(missing)}")
        return servers

    @field_validator("repo")
    @classmethod
    def _repo_without_credentials(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("must not be blank")
        if re.match(r"^[a-z][a-z0-9+.-]*://[^/@]*:[^/@]*@", value, re.I) or re.match(
                r"^https?://[^/@]+@", value, re.I):
            raise ValueError("must not carry credentials (they would be stored with the "
                             "session); use a credential helper or an ssh key where the "
                             "sandbox runs")
        return value

    @field_validator("branch")
    @classmethod
    def _branch_name(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or value.startswith("-")):
            raise ValueError("must be a branch or tag name")
        return value

    @model_validator(mode="after")
    def _branch_needs_repo(self) -> SessionConfig:
        if self.branch is not None and self.repo is None:
            raise ValueError("branch is given without repo")
        return self
    _runtime_named = field_validator("runtime", mode="before")(_runtime_by_name)


class RestartPolicy(BaseModel):
    """How a supervisor restarts its children."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    intensity: int = Field(default=5, ge=0)
    """Restarts of one child allowed within ``period_s``; past that the supervisor gives up."""
    period_s: float = Field(default=60.0, gt=0)
    backoff_initial_s: float = Field(default=0.05, ge=0)
    """Upper bound of the wait before the second restart in ``period_s`` (the first is
    at once); it doubles for each one after."""
    backoff_max_s: float = Field(default=5.0, ge=0)
    """Cap on one wait before a restart."""
    giveup_cooldown_s: float = Field(default=30.0, ge=0)
    """After giving up on a child: wait this long, then try it again from a clean start."""
    giveup_cooldown_max_s: float = Field(default=300.0, ge=0)
    """Cap on the cooldown, which doubles each round."""
    giveup_rounds: int = Field(default=3, ge=0)
    """Cooldown rounds before a child stays down until a user resumes; 0 never retries."""

    def cooldown_s(self, round_no: int) -> float | None:
        """The wait after give-up round ``round_no`` (1 for the first); None: stay down."""
        if round_no > self.giveup_rounds:
            return None
        return min(self.giveup_cooldown_max_s, self.giveup_cooldown_s * 2 ** (round_no - 1))
