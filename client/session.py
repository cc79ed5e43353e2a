"""``Session``: the handle a program holds on one session of an embedded ``Trouper``.

It implements ``client_protocol.SessionHandle``, as a daemon's ``RemoteSession`` does.
Commands go to the actor tree and return once the Controller has recorded them; state
and events are read from the log, so they are the truth even after a restart. Every
method raises UnknownSession for an id the store does not hold.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from ..config.settings import settings
from ..core.fold import SessionView
from ..messages.events import ActionEvent, AgentState, Event
from .info import SessionInfo

if TYPE_CHECKING:
    from ..home.paths import Home
    from ..store import EventStore, SessionRecord
    from ..workspace_diff import WorkspaceDiff


def new_session_id() -> str:
    """The id a session gets when its caller names none."""
    return "s-" + uuid.uuid4().hex[:12]


class SessionOwner(Protocol):
    """What a ``Session`` needs of the ``Trouper`` that made it (the API implements it)."""

    @property
    def store(self) -> EventStore: ...

    @property
    def home(self) -> Home: ...

    def fault(self, session_id: str, timeout_s: float | None = None) -> str | None: ...

    def command(self, session_id: str, command: str, text: str = "", *,
                action_id: str = "") -> int: ...


class Session:
    """One session of a ``Trouper`` (a ``SessionHandle``). Cheap to make; holds no
    resources of its own."""

    def __init__(self, trouper: SessionOwner, session_id: str) -> None:
        self._trouper = trouper
        self.id = session_id

    def __repr__(self) -> str:
        return f"Session({self.id!r}, state={self.state.value!r})"

    @property
    def record(self) -> SessionRecord:
        """The stored record: config, state, last seq, timestamps (embedded only: a
        daemon's session tells the same through ``info()``)."""
        return self._trouper.store.session(self.id)

    def info(self) -> SessionInfo:
        """The session at a glance: its summary, state, fault, cost, steps, config."""
        record = self.record
        return SessionInfo.of(record, self.view(), self._trouper.fault(self.id))

    @property
    def state(self) -> AgentState:
        """The state in the log; ERROR while a storage fault keeps it from recording."""
        return AgentState.ERROR if self.fault else self.record.state

    @property
    def fault(self) -> str | None:
        """Why the session cannot record anything right now (a full disk...), or None."""
        return self._trouper.fault(self.id)

    @property
    def workspace(self) -> str:
        """The absolute path of the folder the agent works in."""
        return self.record.config.workspace

    def view(self) -> SessionView:
        """The session folded from its whole log (state, cost, pending actions...)."""
        return SessionView.of(self._trouper.store.read(self.id))

    def diff(self) -> WorkspaceDiff:
        """What changed in the workspace since the session started, masked (docs/api.md,
        "What the agent changed"); when none can be made, ``available`` is False and
        ``reason`` says why."""
        from ..security.secrets_file import remember_session_secrets
        from ..workspace_diff import workspace_diff
        from ..workspace_diff.model import masked

        config = self.record.config
        remember_session_secrets(self._trouper.home, self.id)
        return masked(workspace_diff(self._trouper.home, self.id, config))

    # -- commands ----------------------------------------------------------------

    def send(self, text: str) -> int:
        """Give the agent a message; a finished or waiting session runs again.

        Returns the seq of the last event the command appended.
        """
        return self._trouper.command(self.id, "send", text)

    def pause(self) -> int:
        """Pause the session: it waits, its sandbox kept, until ``resume``."""
        return self._trouper.command(self.id, "pause")

    def resume(self) -> int:
        """Carry a paused, stopped, rate-limited or failed session on."""
        return self._trouper.command(self.id, "resume")

    def stop(self) -> int:
        """Stop the session and end its sandbox; ``resume`` goes on in a fresh one."""
        return self._trouper.command(self.id, "stop")

    def approve(self, action_id: str = "") -> int:
        """Run the action waiting for approval (confirmation mode). With ``action_id``,
        only if that is the one waiting (else InvalidRequest)."""
        return self._trouper.command(self.id, "approve", action_id=action_id)

    def reject(self, reason: str = "", action_id: str = "") -> int:
        """Do not run the action waiting for approval: it is recorded ``rejected`` with
        ``reason`` (the agent reads it) and the session carries on."""
        return self._trouper.command(self.id, "reject", reason, action_id=action_id)

    def budget(self, max_cost_usd: float | None = None,
               max_iterations: int | None = None) -> int:
        """Set the session's budget from now on (either limit, or both). A session paused
        because a budget ran out (``on_budget="ask"``) carries on if the new one lasts;
        one that would still be spent is refused (InvalidRequest, nothing changed)."""
        return self._trouper.command(self.id, "budget", budget_text(max_cost_usd,
                                                                     max_iterations))

    @property
    def awaiting_confirmation(self) -> ActionEvent | None:
        """The action waiting for the user's approval, or None."""
        return self.view().awaiting_confirmation

    # -- reading -------------------------------------------------------------------

    def events(
        self,
        since: int = 0,
        *,
        follow: bool = False,
        until_settled: bool = True,
        timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Typed events with seq > ``since``, in order.

        With ``follow``, keep yielding new events as they are appended: until the session
        is settled with nothing more in its log (``until_settled``), ``timeout_s`` passes,
        or ``stop`` is set. An unknown id raises UnknownSession here, not at the first
        event.
        """
        self._trouper.store.last_seq(self.id)
        return self._events(since, follow, until_settled, timeout_s, stop)

    def _events(
        self, since: int, follow: bool, until_settled: bool, timeout_s: float | None,
        stop: threading.Event | None,
    ) -> Iterator[Event]:
        store = self._trouper.store
        if not follow:
            yield from store.read(self.id, since=since)
            return
        view = SessionView.of(store.read(self.id, limit=since)) if since else SessionView()
        if until_settled and self._caught_up_and_settled(view):
            return
        for event in store.follow(self.id, since=since, timeout_s=timeout_s, stop=stop):
            view.apply(event)
            yield event
            if until_settled and self._caught_up_and_settled(view):
                return

    def _caught_up_and_settled(self, view: SessionView) -> bool:
        return view.settled and view.last_seq >= self._trouper.store.last_seq(self.id)

    def wait(self, timeout: float | None = None) -> AgentState:
        """Block until the session is settled (or ``timeout`` seconds pass); return its state.

        Settled: it will not move again without the user (FINISHED, STOPPED, PAUSED,
        AWAITING_USER_INPUT, AWAITING_USER_CONFIRMATION, or ERROR with no automatic resume
        pending). Not settled, so waited through: RATE_LIMITED, an ERROR with
        ``resumes_at`` (a cooldown after the restart intensity, or a sandbox being
        restarted), and a storage fault, during which the log cannot record anything
        (its last state may even read as settled) and ``state`` is ERROR. At the timeout
        it returns the state as ``state`` would: ERROR while a storage fault lasts.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        view = SessionView.of(self._trouper.store.read(self.id))

        def faulted() -> bool:  # asked within what is left of the wait (a hung tree...)
            left = None if deadline is None else max(0.1, deadline - time.monotonic())
            return self._trouper.fault(self.id, timeout_s=left) is not None

        while True:
            logged = self._caught_up_and_settled(view)
            if logged and not faulted():
                return view.state
            left_s = None if deadline is None else deadline - time.monotonic()
            if left_s is not None and left_s <= 0:
                return AgentState.ERROR if faulted() else view.state
            if logged:  # yet faulted: no event will come to wake us, so ask again soon
                poll_s = settings().fault_poll_s
                left_s = poll_s if left_s is None else min(poll_s, left_s)
            self._follow_until_settled(view, left_s)

    def _follow_until_settled(self, view: SessionView, timeout_s: float | None) -> None:
        """Fold new events into ``view`` until its log is settled or ``timeout_s`` passes."""
        for event in self._trouper.store.follow(self.id, since=view.last_seq,
                                                timeout_s=timeout_s):
            view.apply(event)
            if self._caught_up_and_settled(view):
                return


def budget_text(max_cost_usd: float | None, max_iterations: int | None) -> str:
    """A ``budget`` command's text: the limits given, as JSON."""
    limits = {"max_cost_usd": max_cost_usd, "max_iterations": max_iterations}
    return json.dumps({k: v for k, v in limits.items() if v is not None})
