"""Messages inside the actor tree: boots, rewiring, relays, shutdown, and last words.

They carry actor addresses, so they never leave the actor system and are never stored.
``messages/`` imports no Thespian: an ``Address`` field holds a Thespian ``ActorAddress``
(checked by nobody but Thespian). Grouped by who sends them to whom.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from ..config.models import RestartPolicy
from .base import Frozen
from .protocol import StartSession

Address = Any
"""A Thespian ``ActorAddress``."""

# ---- the program and the root -------------------------------------------------------


class BootRoot(Frozen):
    """Program -> RootSupervisor: the home and the restart policy of the tree."""

    kind: Literal["boot_root"] = "boot_root"
    home: str
    policy: RestartPolicy


class Shutdown(Frozen):
    """Down the tree: close gracefully, stop sandboxes, then answer ``ShutdownDone``."""

    kind: Literal["shutdown"] = "shutdown"
    request_id: str
    stop_sandboxes: bool = True


class ShutdownDone(Frozen):
    kind: Literal["shutdown_done"] = "shutdown_done"
    request_id: str
    sessions: list[str] = Field(default_factory=list)
    """The sessions whose sandboxes were closed."""
    held: list[str] | None = None
    """The root's answer: every session whose actors the tree ran when the shutdown came
    (the program removes what is left of their containers); None from below the root."""


class Relay(Frozen):
    """A request passed down the tree; whoever handles it answers ``reply_to`` directly."""

    kind: Literal["relay"] = "relay"
    msg: Any
    reply_to: Address | None


# ---- the root and the session supervisors ------------------------------------------


class BootBroker(Frozen):
    kind: Literal["boot_broker"] = "boot_broker"
    home: str


class BootGroup(Frozen):
    """Root -> SessionSupervisor: watch the sessions the root hands it (``WatchSession``),
    each under ``policy``, their Controllers asking ``broker``."""

    kind: Literal["boot_group"] = "boot_group"
    broker: Address
    policy: RestartPolicy


class WatchSession(Frozen):
    """Root -> SessionSupervisor: start (or restore) one session of its group, its
    RuntimeProxy and its Controller; the Controller's boot answers ``reply_to``."""

    kind: Literal["watch_session"] = "watch_session"
    start: StartSession
    reply_to: Address | None = None


class BrokerMoved(Frozen):
    """Root -> SessionSupervisors: the broker was restarted at a new address."""

    kind: Literal["broker_moved"] = "broker_moved"
    broker: Address


class Working(Frozen):
    """Agent loop -> its parent (and a SessionSupervisor -> the root): whether the session
    is working (not settled); while it is, the parent probes it (``actors/loop_watch.py``)."""

    kind: Literal["working"] = "working"
    session_id: str
    working: bool


class BrokerSlow(Frozen):
    """Agent loop -> (SessionSupervisor ->) root: its model call has waited ``waited_s``
    for the broker; the root probes the broker, which a hung broker does not answer
    (``actors/probing.py``)."""

    kind: Literal["broker_slow"] = "broker_slow"
    session_id: str
    waited_s: float


class Superseded(Frozen):
    """Up the tree: a newer Controller owns the session's log (another Trouper restored
    it), or the session cannot go on: stand down."""

    kind: Literal["superseded"] = "superseded"
    session_id: str
    reason: str


# ---- a session supervisor and its children ------------------------------------------


class BootController(Frozen):
    """SessionSupervisor -> a Controller: run the session."""

    kind: Literal["boot_controller"] = "boot_controller"
    start: StartSession
    broker: Address | None
    runtime: Address | None
    """The session's RuntimeProxy."""
    reply_to: Address | None = None


class RecordDowntime(Frozen):
    """SessionSupervisor -> a one-shot Controller: the agent loop is down past its restart
    intensity. The Controller is the log's only writer, so a stand-in records it, answers
    ``DowntimeRecorded`` and exits."""

    kind: Literal["record_downtime"] = "record_downtime"
    start: StartSession
    reason: str
    resumes_at: datetime | None = None


class CloseFor(Frozen):
    """SessionSupervisor (or, while the tree closes, the root) -> a one-shot RuntimeProxy:
    the sandbox is to close while the session's proxy (or supervisor) is down; stop it,
    answer ``SandboxClosed`` and exit."""

    kind: Literal["close_for"] = "close_for"
    start: StartSession
    request_id: str


class CommandAnswered(Frozen):
    """The agent loop's answer to the user command ``request_id``, going back up the way
    the command came down: to its SessionSupervisor, which passes it up to the root, and
    from the root to ``reply_to``. Each
    parent lets go of the command only as it passes the answer on, so a process that
    dies between the two leaves it held and handed again (``actors/in_flight.py``)."""

    kind: Literal["command_answered"] = "command_answered"
    session_id: str
    request_id: str
    answer: Any = None
    """``Accepted`` or ``Refused``."""
    reply_to: Address | None = None


class StandingDown(Frozen):
    """Controller -> SessionSupervisor -> root: the session is settled and has been idle
    for ``settled_stand_down_s``; it would close its sandbox and go. ``relays`` counts the
    relays the sender has received, so its parent can tell none is on its way to it."""

    kind: Literal["standing_down"] = "standing_down"
    session_id: str
    relays: int


class StandDown(Frozen):
    """Root -> SessionSupervisor -> Controller: go (``go``; the root holds the session's
    commands meanwhile), or stay (a command is on its way, or the tree closes)."""

    kind: Literal["stand_down"] = "stand_down"
    session_id: str
    go: bool


class SteppedDown(Frozen):
    """Controller -> SessionSupervisor: still idle, close the sandbox (``stayed``: it has
    work after all). SessionSupervisor -> root: the sandbox is closed and the session may
    be stopped; or (``stayed``) the commands held meanwhile are its to take."""

    kind: Literal["stepped_down"] = "stepped_down"
    session_id: str
    stayed: bool = False


class ForgetHistory(Frozen):
    """SessionSupervisor -> broker: the session stood down; let go of its history (a restored
    session sends its first request whole)."""

    kind: Literal["forget_history"] = "forget_history"
    session_id: str


class DowntimeRecorded(Frozen):
    """A stand-in Controller -> its SessionSupervisor: the downtime is in the log (or
    ``error`` says why it is not)."""

    kind: Literal["downtime_recorded"] = "downtime_recorded"
    session_id: str
    error: str = ""


class DowntimeUnrecorded(Frozen):
    """SessionSupervisor -> root: the session's agent loop is down and no stand-in could
    write that in its log (its process could not be made): the root tells the session's
    clients instead (``Session.fault``), until its Controller is up again."""

    kind: Literal["downtime_unrecorded"] = "downtime_unrecorded"
    session_id: str
    reason: str


class BootRuntime(Frozen):
    kind: Literal["boot_runtime"] = "boot_runtime"
    start: StartSession


class Rewire(Frozen):
    """SessionSupervisor -> Controller: a sibling has a new address (it was restarted)."""

    kind: Literal["rewire"] = "rewire"
    broker: Address | None = None
    runtime: Address | None = None
    reason: str = ""


class RuntimeGaveUp(Frozen):
    """SessionSupervisor -> Controller: the sandbox is down until ``resumes_at`` (the
    supervisor then starts a fresh one by itself) or, with None, until a resume."""

    kind: Literal["runtime_gave_up"] = "runtime_gave_up"
    reason: str
    resumes_at: datetime | None = None


class RestartRuntime(Frozen):
    """Controller -> SessionSupervisor: a user's resume; start a fresh runtime proxy."""

    kind: Literal["restart_runtime"] = "restart_runtime"
    reason: str


class EndSandbox(Frozen):
    """Controller -> SessionSupervisor: the session stopped; end its sandbox now and answer
    ``SandboxClosed``. No runtime proxy starts again until ``RestartRuntime``."""

    kind: Literal["end_sandbox"] = "end_sandbox"
    reason: str


# ---- any child and its supervisor ---------------------------------------------------


class Failing(Frozen):
    """Child -> supervisor: it is about to exit on purpose, and why (its last words)."""

    kind: Literal["failing"] = "failing"
    role: str
    reason: str
    error_class: str = ""
    traceback: str = ""


class BootedUp(Frozen):
    """Child -> supervisor: its boot handler returned, so it answers probes from now on;
    a child still booting (a long log to read) is not probed (``actors/probing.py``)."""

    kind: Literal["booted_up"] = "booted_up"


class Probe(Frozen):
    """Supervisor -> child: do you still answer? A child whose command went unanswered
    is asked; every actor answers ``ProbeAnswer`` at once, before anything it holds, so
    one that does not within ``probe_answer_s`` is hung (``actors/probing.py``)."""

    kind: Literal["probe"] = "probe"
    token: str


class ProbeAnswer(Frozen):
    kind: Literal["probe_answer"] = "probe_answer"
    token: str
