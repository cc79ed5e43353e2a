"""What the agent loop tells its parent so that a hung process near it is found.

A hung process (stopped, deadlocked, starved) does not die, so no supervisor hears of it;
a parent finds one by probing it (``probing.py``), and this is what makes it probe while
nobody sends a command:

- ``Working``: whether the session is working (not settled). While it is, its parent
  probes its process every ``working_probe_s``; a settled session is not probed (an idle
  session costs nothing). Told on a change only.
- ``BrokerSlow``: a model call has waited ``model_call_probe_s`` for the broker (shared,
  the root's child): the root probes the broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config.settings import settings
from ..core.states import settled
from ..messages.tree import BrokerSlow, Working
from .base import TrouperActor

if TYPE_CHECKING:
    from thespian.actors import ActorAddress

    from ..core.session import SessionCore


class LoopWatch(TrouperActor):
    """The Controller's half that tells its parent what to watch."""

    core: SessionCore | None
    broker: ActorAddress | None
    session_id: str

    def __init__(self) -> None:
        super().__init__()
        self.model_call_watched = False
        """A timer looks at the model call waiting for the broker (``on_timer_model_call``)."""
        self.told_working: bool | None = None
        """What the parent was last told (None: nothing yet, in this incarnation)."""

    def tell_working(self) -> None:
        """Tell the parent whether the session works, when that changed."""
        core = self.core
        if core is None or self._stopping:
            return
        view = core.view
        working = not settled(view.state, view.resumes_at)
        if working != self.told_working:
            self.told_working = working
            self.send(self._parent_address, Working(session_id=self.session_id,
                                                    working=working))

    def watch_model_call(self, request_id: str) -> None:
        """Tell the root should this call wait ``model_call_probe_s`` for the broker. One
        timer at a time: when it fires, it looks at whichever call is waiting then."""
        if not self.model_call_watched:
            self.model_call_watched = True
            self.after(settings().model_call_probe_s, "model_call", request_id)

    def on_timer_model_call(self, request_id: str) -> None:
        self.model_call_watched = False
        waiting = self.core.llm_request if self.core is not None else None
        if waiting is None or self._stopping or self.broker is None:
            return
        if waiting.request_id == request_id:
            self.send(self._parent_address, BrokerSlow(
                session_id=self.session_id, waited_s=settings().model_call_probe_s))
        self.watch_model_call(waiting.request_id)
