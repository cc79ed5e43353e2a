"""The base every trouper message and event derives from."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from .text import storable


class Frozen(BaseModel):
    """An immutable, JSON-serialisable pydantic model that rejects unknown fields.

    Any text it is built from is storable: lone surrogates (which a model's JSON or a
    command's bytes can carry) become U+FFFD at construction, so no message or event can
    fail to serialise, be stored or be sent later.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        return storable(data)

    def __str__(self) -> str:
        # Thespian formats every message it sends for a debug line, logging or not; the
        # default would render a whole prompt history on every step.
        ids = [f"{name}={getattr(self, name)}" for name in _ID_FIELDS if hasattr(self, name)]
        return f"{type(self).__name__}({', '.join(ids)})"


_ID_FIELDS = ("kind", "session_id", "request_id", "action_id", "seq")
