"""The base every trouper message and event derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable, JSON-serialisable pydantic model that rejects unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __str__(self) -> str:
        # Thespian formats every message it sends for a debug line, logging or not; the
        # default would render a whole prompt history on every step.
        ids = [f"{name}={getattr(self, name)}" for name in _ID_FIELDS if hasattr(self, name)]
        return f"{type(self).__name__}({', '.join(ids)})"


_ID_FIELDS = ("kind", "session_id", "request_id", "action_id", "seq")
