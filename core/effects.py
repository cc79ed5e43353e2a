"""What the session core asks its adapter to do, and the inputs only an adapter can know.

The core (``core.session``) never performs I/O: every handler returns a list of effects,
and the Controller actor performs them in order. An ``Append`` that fails stops the list
there, so nothing after it happens whose record is not durable (promise I2,
docs/promises.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..messages.events import Event
from ..messages.protocol import Complete, Execute


@dataclass(frozen=True)
class Append:
    """Append these events to the session's log in one transaction (already masked,
    stamped with the seq the core expects: it is the log's only writer)."""

    events: tuple[Event, ...]


@dataclass(frozen=True)
class ReadInstructions:
    """The workspace changed under the agent (a repository was cloned into it): read its
    instructions file again and give the text to ``SessionCore.set_instructions``."""


@dataclass(frozen=True)
class AskModel:
    """Send this completion request to the broker (or hold it until there is one)."""

    request: Complete


@dataclass(frozen=True)
class CancelModel:
    request_id: str


@dataclass(frozen=True)
class RunAction:
    """Send this action to the runtime (its placeholders already revealed)."""

    request: Execute


@dataclass(frozen=True)
class AskJournal:
    """Ask the runtime's journal what became of an action that may have run."""

    action_id: str


@dataclass(frozen=True)
class StartTimer:
    """Call the core back with ``TimerFired(name, token)`` after ``delay_s``."""

    name: str
    delay_s: float
    token: Any = None


@dataclass(frozen=True)
class RestartRuntime:
    """The sandbox was given up on and the user resumed: start a fresh one."""

    reason: str


@dataclass(frozen=True)
class EndSandbox:
    """The session stopped: end its sandbox now (the shell, every job it started, and the
    container unless ``keep``), then feed back ``SandboxEnded``. The requests in flight to
    it come back first (an action's real outcome, when it has one); nothing starts in it
    after this, and only ``RestartRuntime`` brings a fresh one."""

    reason: str


@dataclass(frozen=True)
class Answer:
    """Answer the user's command ``request_id``: accepted (``error`` None) or refused."""

    request_id: str
    error: str | None
    seq: int


Effect = Append | AskModel | CancelModel | RunAction | AskJournal | StartTimer | \
    RestartRuntime | EndSandbox | Answer | ReadInstructions


# -- inputs the actor layer turns into plain facts ----------------------------------


@dataclass(frozen=True)
class TimerFired:
    name: str
    token: Any = None


@dataclass(frozen=True)
class BrokerBack:
    """A broker is (again) there to ask: a held or lost request goes to it."""


@dataclass(frozen=True)
class RuntimeReplaced:
    """A fresh runtime proxy was started: what was dispatched to the old one must be
    asked of the journal before anything runs."""


@dataclass(frozen=True)
class SandboxEnded:
    """The sandbox an ``EndSandbox`` asked to end is ended (or its end was given up on:
    nothing more comes back from it either way)."""


@dataclass(frozen=True)
class RuntimeDown:
    """The supervisor gave up on the sandbox: ERROR until ``resumes_at`` (a fresh one
    then arrives) or, with None, until the user resumes."""

    reason: str
    resumes_at: datetime | None = None
