"""The Controller's part of a settled session's stand-down (``actors/root_sessions.py``).

A session settled for ``settled_stand_down_s`` (finished, waiting for the user, stopped,
paused) with nothing pending asks its supervisor to stand down (``StandingDown``, with
the number of relays it has had, so that one on its way is never lost). When the root
says go (``StandDown``), it looks once more: still idle, it says so (``SteppedDown``)
and its supervisor closes the sandbox; busy after all, it stays (``stayed``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from thespian.actors import ActorAddress

from ..config.settings import settings
from ..core.states import settled
from ..messages.tree import StandDown, StandingDown, SteppedDown
from .base import TrouperActor

if TYPE_CHECKING:
    from ..core.session import SessionCore
    from ..exceptions import StoreUnavailable

RESTORED_GRACE_S = 5.0
"""A restored session stands down no sooner than this after its start: one restored for
a command is settled at once, and the command is on its way."""


class SettledStandDown(TrouperActor):
    """The Controller's half of the stand-down (mixed into ``Controller``)."""

    core: SessionCore | None
    store_fault: StoreUnavailable | None
    session_id: str

    def __init__(self) -> None:
        super().__init__()
        self.relays_seen = 0
        """Relays (user commands) received: it stands down only when its supervisor has
        handed it no more than this."""
        self.standing_down = False
        self._stand_down_seq: int | None = None
        """The settled log position a stand-down timer waits on."""
        self._grace_until = 0.0
        """No stand-down before this (``time.monotonic()``): set for a restored session."""

    def restored_grace(self) -> None:
        self._grace_until = time.monotonic() + RESTORED_GRACE_S

    def _idle_settled(self) -> bool:
        core = self.core
        if core is None or self._stopping or self.store_fault is not None:
            return False
        view = core.view  # (``view.settled`` builds an event: too dear for every input)
        return settled(view.state, view.resumes_at) and not view.pending

    def consider_standing_down(self) -> None:
        """Set the stand-down timer for this settled position of the log (once)."""
        if self.standing_down or not self._idle_settled():
            return
        seq = self.core.view.last_seq  # type: ignore[union-attr]
        if self._stand_down_seq != seq:
            self._stand_down_seq = seq
            grace_s = self._grace_until - time.monotonic()
            self.after(max(settings().settled_stand_down_s, grace_s), "stand_down", seq)

    def on_timer_stand_down(self, seq: int) -> None:
        if self.standing_down or self.core is None or seq != self.core.view.last_seq:
            return  # it moved meanwhile: a later settled position sets its own timer
        if not self._idle_settled():  # busy for now at this position: set again once idle
            self._stand_down_seq = None
            return
        self.standing_down = True
        self.send(self._parent_address, StandingDown(session_id=self.session_id,
                                                     relays=self.relays_seen))

    def on_stand_down(self, msg: StandDown, sender: ActorAddress) -> None:
        if not self.from_parent(msg, sender, "who supervises the session"):
            return
        if not self.standing_down:
            self.drop(msg, "it asked for no stand-down")
            return
        if msg.go and self._idle_settled():  # its supervisor closes the sandbox now
            self.send(sender, SteppedDown(session_id=self.session_id))
            return
        # a command is on its way (it comes, or the timer is set again), or work came
        self.standing_down, self._stand_down_seq = False, None
        if msg.go:
            self.send(sender, SteppedDown(session_id=self.session_id, stayed=True))
        self.consider_standing_down()
