"""Rewinding a session: a fork (``client/fork.py``) that takes the original's place in the
user's list of sessions (docs/time-travel.md, "Rewind").

The original, stopped if it is still working, is marked replaced by the fork in the
store's session meta (``REPLACED_BY``; the fork ``REPLACES`` it), so the lists of sessions
(``sessions()``, ``GET /v1/sessions``, ``trouper sessions``) leave it out unless asked
for replaced ones. Nothing else of it changes: its log (but for the stop), its workspace
and its checkpoints stay, and it still opens by its id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exceptions import InvalidRequest
from ..store.base import REPLACED_BY, REPLACES

if TYPE_CHECKING:
    from ..store import EventStore
    from .protocol import SessionHandle


def replace(store: EventStore, original: SessionHandle, new_id: str) -> bool:
    """Give ``original``'s place in the lists of sessions to the session ``new_id``: stop
    it if it is still working (not settled), then mark it replaced. Returns whether it
    was stopped."""
    stopped = False
    if not original.info().settled:
        try:
            original.stop()
            stopped = True
        except InvalidRequest:
            if not original.info().settled:  # settled meanwhile: nothing left to stop
                raise
    # marked once stopped: a stop that failed leaves the original listed, as it is
    store.put_meta(new_id, REPLACES, original.id)
    store.put_meta(original.id, REPLACED_BY, new_id)
    return stopped


__all__ = ["replace"]
