"""trouper: LLM coding-agent sessions as supervised actors.

The show goes on: a crashed sandbox, a dropped connection, a rate-limited model or a
restarted process never leaves a session stuck, loses an event, or runs an action twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .client_protocol import SessionHandle, TrouperClient
from .config import ConfirmationPolicy, LLMConfig, SessionConfig
from .exceptions import (
    ConfigError,
    InvalidRequest,
    RequestTimeout,
    RuntimeUnavailable,
    StaleEpoch,
    StoreError,
    TrouperError,
    UnknownSession,
)
from .messages.events import (
    ActionEvent,
    AgentState,
    ConfirmationEvent,
    Event,
    LLMCompleted,
    LLMRetry,
    MessageEvent,
    ObservationEvent,
    RuntimeEvent,
    StateChanged,
)
from .messages.outcomes import Outcome
from .restarts import RestartPolicy
from .session_info import SessionInfo, SessionSummary

if TYPE_CHECKING:
    from .api import Trouper
    from .session import Session

logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name: str) -> Any:
    # Trouper pulls in litellm and the actors (seconds): load it only when asked for.
    if name == "Trouper":
        from .api import Trouper

        return Trouper
    if name == "Session":
        from .session import Session

        return Session
    raise AttributeError(f"module 'trouper' has no attribute {name!r}")

__all__ = [
    "ActionEvent",
    "AgentState",
    "ConfirmationEvent",
    "ConfirmationPolicy",
    "ConfigError",
    "Event",
    "InvalidRequest",
    "LLMCompleted",
    "LLMConfig",
    "LLMRetry",
    "MessageEvent",
    "ObservationEvent",
    "Outcome",
    "RequestTimeout",
    "RestartPolicy",
    "RuntimeEvent",
    "RuntimeUnavailable",
    "Session",
    "SessionConfig",
    "SessionHandle",
    "SessionInfo",
    "SessionSummary",
    "StaleEpoch",
    "StateChanged",
    "StoreError",
    "Trouper",
    "TrouperClient",
    "TrouperError",
    "UnknownSession",
]
