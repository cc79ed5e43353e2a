"""Messages between trouper's own actors that carry actor addresses.

Thespian addresses are not pydantic types, so these are plain frozen dataclasses. They
never leave the actor system and are never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from thespian.actors import ActorAddress

from ..messages.protocol import StartSession
from ..restarts import RestartPolicy


@dataclass(frozen=True)
class Relay:
    """A request passed down the tree; whoever handles it answers ``reply_to`` directly."""

    kind: ClassVar[str] = "relay"
    msg: Any
    reply_to: ActorAddress | None


@dataclass(frozen=True)
class BootRoot:
    kind: ClassVar[str] = "boot_root"
    home: str
    policy: RestartPolicy


@dataclass(frozen=True)
class BootSession:
    """Root -> SessionSupervisor: start (or restore) one session."""

    kind: ClassVar[str] = "boot_session"
    start: StartSession
    broker: ActorAddress
    policy: RestartPolicy
    reply_to: ActorAddress | None = None


@dataclass(frozen=True)
class BootController:
    kind: ClassVar[str] = "boot_controller"
    start: StartSession
    broker: ActorAddress
    runtime: ActorAddress | None
    reply_to: ActorAddress | None = None


@dataclass(frozen=True)
class BootRuntime:
    kind: ClassVar[str] = "boot_runtime"
    start: StartSession


@dataclass(frozen=True)
class BootBroker:
    kind: ClassVar[str] = "boot_broker"
    home: str


@dataclass(frozen=True)
class Rewire:
    """SessionSupervisor -> Controller: a sibling has a new address (it was restarted)."""

    kind: ClassVar[str] = "rewire"
    broker: ActorAddress | None = None
    runtime: ActorAddress | None = None
    runtime_epoch: int = 0
    reason: str = ""


@dataclass(frozen=True)
class BrokerMoved:
    """Root -> SessionSupervisors: the broker was restarted at a new address."""

    kind: ClassVar[str] = "broker_moved"
    broker: ActorAddress


@dataclass(frozen=True)
class Shutdown:
    """Close gracefully: stop sandboxes, then answer ``ShutdownDone``."""

    kind: ClassVar[str] = "shutdown"
    request_id: str
    stop_sandboxes: bool = True


@dataclass(frozen=True)
class ShutdownDone:
    kind: ClassVar[str] = "shutdown_done"
    request_id: str
    sessions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RuntimeGaveUp:
    """SessionSupervisor -> Controller: the sandbox is down for good until a resume."""

    kind: ClassVar[str] = "runtime_gave_up"
    reason: str
    resumes_at: datetime | None = None
    """When the supervisor starts a fresh sandbox by itself; None: only on a resume."""


@dataclass(frozen=True)
class RestartRuntime:
    """Controller -> SessionSupervisor: a user's resume; start a fresh runtime proxy."""

    kind: ClassVar[str] = "restart_runtime"
    reason: str


@dataclass(frozen=True)
class Superseded:
    """A newer Controller owns the session's log (another Trouper restored it): stand down."""

    kind: ClassVar[str] = "superseded"
    session_id: str
    reason: str
