"""The base every trouper message and event derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable, JSON-serialisable pydantic model that rejects unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
