"""The contract every sandbox backend keeps (local, and later docker and remote).

Two protocols, kept apart as in SWE-ReX: ``Sandbox`` is the lifecycle a supervisor
watches (start or attach, alive, stop); ``Runtime`` is what the Controller asks for
(execute an action, resolve an action from the journal).

The journal contract (promise I2, docs/promises.md):
- ``execute`` journals the action as *started* before anything runs, *where it runs*
  (the session folder for local, inside the container, on the remote host), and as
  *finished* with its outcome once it ends. Calling ``execute`` again with the same
  ``action_id`` never runs it twice: it returns the journaled outcome, or waits for the
  running action.
- ``resolve`` never runs anything. It answers from the journal: ``finished`` (with the
  real outcome), ``running`` (still going after ``wait_s``), ``absent`` (never started:
  it is safe to execute it now, for the first time) or ``unknown`` (it started and nobody
  can know how it ended: the caller records it as ``lost``).
- Every request carries the proxy's *epoch*. ``Sandbox.start()`` claims the next epoch
  the sandbox counts (``epoch`` says which one it got); from then on requests with an
  older epoch raise ``StaleEpoch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from ..messages.actions import RuntimeAction
from ..messages.base import Frozen
from ..messages.causes import RuntimeFailure
from ..messages.outcomes import Outcome

if TYPE_CHECKING:  # messages.checkpoints reads the sandbox's defaults: no cycle at run time
    from ..messages.checkpoints import CheckpointPolicy

JournalState = Literal["absent", "running", "finished", "unknown"]


class JournalRecord(Frozen):
    """What a runtime's journal knows about one action."""

    action_id: str
    state: JournalState
    outcome: Outcome | None = None
    """Set when ``state`` is ``finished``."""
    epoch: int = 0
    """The epoch of the proxy that started the action."""


class SandboxHealth(Frozen):
    """The answer of ``Sandbox.alive``."""

    alive: bool
    cause: RuntimeFailure | None = None
    """Why not; None when alive."""
    detail: str = ""


@runtime_checkable
class Runtime(Protocol):
    """Runs actions; idempotent by action id. Methods block: call them off the actor thread."""

    def execute(
        self,
        action_id: str,
        action: RuntimeAction,
        *,
        timeout_s: float,
        no_output_timeout_s: float,
        checkpoint: CheckpointPolicy | None = None,
    ) -> Outcome:
        """Run ``action`` once and return its outcome (see the journal contract); with
        ``checkpoint``, snapshot the workspace once it ended (the outcome names it)."""
        ...

    def resolve(self, action_id: str, *, wait_s: float = 0.0) -> JournalRecord:
        """What became of ``action_id``, waiting up to ``wait_s`` for a running one."""
        ...


@runtime_checkable
class Sandbox(Protocol):
    """The lifecycle of one session's sandbox."""

    def start(self, epoch: int | None = None) -> bool:
        """Start the sandbox, or attach to the one already running; claim ``epoch``, or
        (None) the next epoch the sandbox itself counts: monotonic whatever the clocks do.

        Returns True when an existing sandbox was attached.
        Raises RuntimeUnavailable when it cannot be started or reached. A backend whose
        start can wait long (the remote one, for its server) also has ``cancel()``, which
        the proxy calls from its own thread when told to close mid-start: the start then
        raises at once instead of holding the close.
        """
        ...

    @property
    def epoch(self) -> int | None:
        """The epoch claimed by the last ``start``."""
        ...

    @property
    def runtime(self) -> Runtime:
        """The action runtime of the started sandbox."""
        ...

    def alive(self) -> SandboxHealth:
        """Whether the sandbox still answers, and why not."""
        ...

    def stop(self) -> None:
        """Stop the sandbox and what runs in it. Idempotent and bounded in time."""
        ...

    def running(self) -> bool:
        """Whether this session's sandbox runs, asked without a started client (the
        fault-injection harness builds a fresh backend object to ask)."""
        ...

    def kill(self) -> int | str | None:
        """Crash the sandbox the hard way (SIGKILL, ``docker kill``), for fault injection:
        what ran in it is lost. What was killed (a pid, a container id), or None."""
        ...
