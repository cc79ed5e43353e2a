"""trouper's timing policy in one place: what may change without
changing the protocol.

``Settings`` holds the constants that are a choice (how long a rate window is, how much
slack it keeps), not a fact of a wire format. Each has a default and may be overridden
through an environment variable named ``TROUPER_`` plus the field's name in capitals
(``TROUPER_RATE_WINDOW_S=6``), which beats the ``[settings]`` tables of the config files
(``config/files.py``) that the ``trouper`` command hands over with ``use_file_settings``
(a program using the API reads none unless it does the same). ``settings()`` is this
process's instance, read once.

Actor processes are forked from the program that opens the ``Trouper`` (through
Thespian's admin), and each reads its own environment again after the fork (the cache is
forgotten in every forked child), so an override set in the environment before
``Trouper()`` opens reaches every actor, even when this process read the settings
earlier. The files' tables are module state that a fork copies: a forked actor sees the
values the program read, without reading a file. ``Trouper()`` validates the environment
before it forks anything, so a bad value is refused there, naming the variable, not in an
actor; a file's values were checked when it was read.

Restart budgets are per policy (``restarts.RestartPolicy``); the sandbox server's own
limits (``runtimes/sandbox/``) are its command-line options, since it runs without
trouper's package.

Example:
    >>> Settings.from_env({"TROUPER_RATE_WINDOW_S": "6"}).rate_window_s
    6.0
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .checks import config_error, pydantic_problems

ENV_PREFIX = "TROUPER_"
"""Every setting's variable is this prefix plus the field's name in capitals."""


class Settings(BaseModel):
    """trouper's timing constants that are policy; see the module docstring."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate_window_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    """Length of the sliding window that a key's ``rpm`` and ``tpm`` are counted over.
    Providers count per minute, so change it only to compress time in a test against a
    server that counts over the same window."""
    rate_window_margin_s: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    """Extra time an admitted call counts in its window: it reaches the provider a little
    after its admission, and must not land in the provider's next window (seen here: one
    429 in 80 calls at the exact window boundary without it)."""

    sandbox_health_every_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    """How often a runtime proxy asks its sandbox whether it still lives (a sandbox that
    died while idle is replaced within about this long)."""
    sandbox_watched_health_every_s: float = Field(default=100.0, gt=0, allow_inf_nan=False)
    """The same for a sandbox whose process the proxy watches (a local server: its exit
    wakes the proxy at once), so an idle session costs next to nothing: this slow check
    finds a server that lives but no longer answers, and keeps it from idling out (it
    runs at least three times per ``sandbox_idle_timeout_s``)."""
    journal_resolve_wait_s: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    """How long one ``resolve`` waits for an action still running before answering so."""
    journal_retry_first_s: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    """First wait before an action the sandbox could not journal is tried again."""
    journal_retry_max_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    """Cap on that wait, which doubles each try."""
    store_probe_first_s: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    """First wait before a Controller whose store refused a write tries again."""
    store_probe_max_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    """Cap on that wait, which doubles each probe."""
    fault_poll_s: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    """How often ``Session.wait()`` asks again about a storage fault."""
    shutdown_deadline_s: float = Field(default=15.0, gt=0, allow_inf_nan=False)
    """How long a closing actor system waits for sessions to stop their sandboxes."""
    owner_check_s: float = Field(default=0.2, gt=0, allow_inf_nan=False)
    """How often an embedded actor system's admin checks that its program still runs."""
    sandbox_idle_timeout_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    """A local sandbox server with no request for this long exits (a restarted program
    can re-attach to it within that time)."""
    sandbox_uid: int = Field(default=65532, gt=0, lt=2**32 - 1)
    """The uid, and gid, a Docker sandbox runs as when trouper runs as root and the
    workspace is root's (the workspace is then handed to it): never root. An unprivileged
    id no account of this machine uses is best (65532 is the usual "nonroot")."""

    unanswered_probe_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    """A user's command its child has not answered for this long makes the parent probe
    that child (``actors/probing.py``): a live one answers at once."""
    probe_answer_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    """A child that does not answer a probe within this is taken for hung (stopped,
    deadlocked, starved) and its process is killed, so it is restarted and the command is
    handed to its successor: commands reach a hung session in about the sum of the two,
    within a program's 30 s request timeout."""

    working_probe_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    """How often a supervisor probes the process of a session that is working (not
    settled): a hung one is killed and restarted, so a session never stands still for
    good. A settled session is not probed."""
    model_call_probe_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    """A model call that has waited this long for the broker makes the root probe the
    broker (a busy one answers at once; a hung one is killed and restarted, and every
    session asks the new one again)."""

    settled_stand_down_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    """A session settled this long (finished, waiting for the user, stopped,
    paused), with nothing pending, closes its sandbox and its process goes; the next
    command restores it from its log (``docs/operations.md``). A sweep that runs many
    sessions in one program then holds only the live ones."""

    sessions_per_supervisor: int = Field(default=16, ge=1, le=1024)
    """How many sessions one SessionSupervisor watches (each session's Controller and
    RuntimeProxy stay actors and processes of their own, restarted one for one): a
    supervisor process costs about 6 MB, so one a session would be a fifth of a session's
    memory; a group shares it (``docs/architecture.md``, "Why a session is two processes
    under a shared supervisor"). 1 gives every session a supervisor of its own."""

    llm_route: Literal["direct", "litellm"] = "direct"
    """How the broker calls an OpenAI-compatible endpoint named by ``base_url``:
    ``direct``, through litellm's provider code without its dispatcher (``llm/direct.py``:
    less than half the CPU a call); ``litellm``, every call through ``litellm.completion``.
    Calls to other providers, and every call while a litellm callback is set, go through
    ``litellm.completion`` either way."""

    log_format: Literal["text", "json"] = "text"
    """How trouper's log lines are written (``logs/trouper.log``, the daemon's log, a
    sandbox's ``server.log``): ``text``, as always, or ``json``, one JSON object a line
    (``home/log_format.py``; docs/operations.md, "Logs")."""

    # What a session's baseline of its workspace may hold (workspace_diff/; docs/api.md,
    # "What the agent changed"): a file or a workspace past them is left out, and said so.
    diff_max_file_bytes: int = Field(default=1024 * 1024, ge=1)
    """A file larger than this is left out of a session's baseline and of its diff (the
    diff names it)."""
    diff_max_files: int = Field(default=20_000, ge=1)
    """A workspace with more files than this (ignored ones aside) gets no baseline: its
    diff says so, and why."""
    diff_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    """The same for a workspace whose files (those under ``diff_max_file_bytes``) add up
    to more than this: the baseline is a copy of them in the trouper home."""

    # The daemon's HTTP limits (daemon/app.py's ``http_limits``; docs/daemon.md, "Limits"):
    # what one client may cost it, read by the daemon process when it starts.
    daemon_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest request body the daemon takes (its routes take JSON: a create, a message);
    a larger declared one is answered 413 unread, a chunked one is cut at it."""
    daemon_max_header_bytes: int = Field(default=32 * 1024, ge=1024)
    """Largest request line and headers the daemon takes (a browser's cookies for
    localhost count: 32 KiB leaves room)."""
    daemon_read_timeout_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    """A request's headers must arrive within this; its body too, plus a second for each
    16 KiB that came (a trickling client is dropped)."""
    daemon_max_connections: int = Field(default=256, ge=1)
    """Connections the daemon holds at once (streams included); more are answered 503
    and closed."""
    daemon_max_connections_per_client: int = Field(default=128, ge=1)
    """Connections from one client address at once (every local client is 127.0.0.1)."""
    metrics_open: bool = False
    """Serve the daemon's ``GET /metrics`` without the token (a local Prometheus that
    holds no token); honoured only while every name the daemon answers to is loopback
    (docs/operations.md, "Metrics")."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The defaults, overridden by the ``TROUPER_<FIELD>`` variables that are set.

        An empty variable counts as unset. Raises ConfigError naming the variable (its
        ``field``) when a value is refused.
        """
        return cls.layered((), environ)

    @classmethod
    def layered(cls, file_layers: Sequence[Mapping[str, Any]],
                environ: Mapping[str, str] | None = None) -> Settings:
        """The defaults, overridden by ``file_layers`` (checked values, lowest precedence
        first: the user's file, a project's), then by the variables that are set.

        Raises ConfigError naming the variable when a variable's value is refused.
        """
        env = os.environ if environ is None else environ
        given = {name: env[env_name(name)] for name in cls.model_fields
                 if env.get(env_name(name), "").strip()}
        merged: dict[str, Any] = {}
        for layer in file_layers:
            merged.update(layer)
        try:
            return cls.model_validate({**merged, **given})
        except ValidationError as e:
            problems = [(env_name(field), _with_value(reason, given.get(field)))
                        for field, reason in pydantic_problems(e)]
            raise config_error(problems) from None


def env_name(field: str) -> str:
    """The environment variable that overrides ``field``: ``TROUPER_RATE_WINDOW_S``."""
    return ENV_PREFIX + field.upper()


_file_layers: tuple[dict[str, Any], ...] = ()
"""The ``[settings]`` tables of the files this program read, lowest precedence first."""


def use_file_settings(file_layers: Sequence[Mapping[str, Any]]) -> None:
    """Let ``settings()`` take these checked tables under the environment, in this process
    and in every process forked from it after this call (before ``Trouper()`` opens)."""
    global _file_layers
    _file_layers = tuple(dict(layer) for layer in file_layers)
    settings.cache_clear()


@functools.cache
def settings() -> Settings:
    """This process's settings: its environment over the files' tables, on first use."""
    return Settings.layered(_file_layers)


# A forked actor reads the environment it was forked with, not its parent's cached copy.
os.register_at_fork(after_in_child=settings.cache_clear)


def _with_value(reason: str, value: str | None) -> str:
    """``reason`` with the refused text, unless pydantic already quoted it."""
    if value is None or "(got " in reason:
        return reason
    return f"{reason} (got {value!r})"
