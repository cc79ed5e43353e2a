"""One session as its SessionSupervisor keeps it: what it knows of the session's two
children (the Controller and the RuntimeProxy, roles ``controller:<id>`` and
``runtime:<id>`` among the supervisor's children) and the commands it holds for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..messages.protocol import RuntimeFailed, RuntimeReady, StartSession
from ..messages.tree import RecordDowntime, Relay
from .in_flight import CommandsInFlight

RUNTIME, CONTROLLER = "runtime", "controller"


def child_role(kind: str, session_id: str) -> str:
    """The supervisor's role name for a session's ``kind`` of child."""
    return f"{kind}:{session_id}"


def split_role(role: str) -> tuple[str, str]:
    """``(kind, session_id)`` of a child role ``child_role`` made."""
    kind, _, session_id = role.partition(":")
    return kind, session_id


@dataclass
class Watched:
    """One session of a SessionSupervisor's group."""

    start: StartSession
    first_reply: Any = None
    """Who the Controller's first boot answers."""
    ready: RuntimeReady | None = None
    """The live proxy's last word that the sandbox is ready (a restarted Controller is told)."""
    misconfigured: RuntimeFailed | None = None
    """The live proxy's word that the sandbox cannot work as configured (it waits for a
    resume, not restarted: a restarted Controller is told)."""
    held: list[Relay] = field(default_factory=list)
    """User commands waiting for the Controller to be up."""
    in_flight: CommandsInFlight = field(default_factory=CommandsInFlight)
    """User commands handed to the Controller and not answered yet."""
    down_for_good: str = ""
    """Why the agent loop stays down until the session is restored ("": it does not)."""
    recording: RecordDowntime | None = None
    """The agent loop's downtime, while a stand-in Controller records it."""
    stand_in: Any = None
    woken: list[Relay] = field(default_factory=list)
    """User commands that came while the downtime was recorded: the user saw ERROR in the
    log and answered it, so they carry the session on once it is recorded."""
    relays_seen: int = 0
    """Relays received from the root (the stand-down says how many)."""
    handed: int = 0
    """Relays handed to the live Controller."""
    standing_down: bool = False
    """The session stands down: once its sandbox is closed, its children go."""
    end_waits: bool = False
    """The Controller waits for the sandbox's end (``SandboxClosed``)."""
    ended: bool = False
    """The sandbox was ended: no proxy starts until the Controller asks again."""
    close_under_way: str | None = None
    """The request id of the sandbox close under way, if one is."""
    closer: Any = None
    """A one-shot proxy closing the sandbox while the session's proxy is down."""

    @property
    def session_id(self) -> str:
        return self.start.session_id

    @property
    def runtime(self) -> str:
        return child_role(RUNTIME, self.session_id)

    @property
    def controller(self) -> str:
        return child_role(CONTROLLER, self.session_id)
