"""What every event store writes and reads back, in one place: the same JSON on any backend.

A config is stored without its API key and masked with every secret value this process
knows; an event is stamped with its ``seq`` and masked the same way (I7 in
docs/promises.md). A config an older trouper stored and this one refuses in part is read
with the refused fields reset to their defaults.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from pydantic import ValidationError

from ..config.models import SessionConfig
from ..messages.events import Event, StateChanged
from ..security.masking import known_masker

logger = logging.getLogger(__name__)


def public_config_json(config: SessionConfig) -> str:
    """The config as stored: the API key is excluded explicitly; every other field is
    masked with the values this process knows (the task may quote a secret)."""
    return known_masker().mask_event(config).model_dump_json(exclude={"llm": {"api_key"}})


def stored_config(session_id: str, config_json: str) -> SessionConfig:
    """A stored config; a field an older trouper allowed and this one refuses (say
    ``no_output_timeout_s=0``) is reset to its default, with a warning, so an old store
    still opens."""
    try:
        return SessionConfig.model_validate_json(config_json)
    except ValidationError as first:
        data = json.loads(config_json)
        for error in first.errors():
            *parents, name = error["loc"]
            holder = data
            for key in parents:
                holder = holder.get(key, {}) if isinstance(holder, dict) else {}
            if isinstance(holder, dict) and holder.pop(name, None) is not None:
                logger.warning("session %s: stored %s is no longer valid (%s); using the "
                               "default", session_id, ".".join(map(str, error["loc"])),
                               error["msg"])
        return SessionConfig.model_validate(data)


def stamp(events: Sequence[Event], last: int) -> list[Event]:
    """Copies of ``events`` numbered after ``last`` and masked: what an append stores and
    returns (masking is a no-op for events their writer masked already)."""
    masker = known_masker()
    return [masker.mask_event(e.model_copy(update={"seq": last + i}))
            for i, e in enumerate(events, 1)]


def last_state(events: Sequence[Event]) -> tuple[str | None, str | None]:
    """The (state, reason) of the last ``StateChanged`` among ``events``; Nones if none."""
    changes = [e for e in events if isinstance(e, StateChanged)]
    return (changes[-1].state.value, changes[-1].reason) if changes else (None, None)
