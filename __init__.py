"""trouper: LLM coding-agent sessions as supervised actors.

The show goes on: a crashed sandbox, a dropped connection, a rate-limited model or a
restarted process never leaves a session stuck, loses an event, or runs an action twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .client.info import SessionInfo, SessionSummary
from .client.protocol import SessionHandle, TrouperClient
from .config.models import ConfirmationPolicy, LLMConfig, RestartPolicy, SessionConfig
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

if TYPE_CHECKING:
    from .client.embedded import Trouper
    from .client.session import Session

logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name: str) -> Any:
    # Trouper pulls in litellm and the actors (seconds): load it only when asked for.
    if name == "Trouper":
        from .client.embedded import Trouper

        return Trouper
    if name == "Session":
        from .client.session import Session

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
