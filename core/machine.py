"""The session core's machinery: its state, its log and its transitions.

``SessionMachine`` holds what a session is (the view folded from its log, the prompt,
what is in flight) and the three ways anything changes: ``_append`` (mask, stamp with
the seq and time the core was given, fold in, and ask the adapter for an ``Append``),
``_move`` (the row of ``core.states.TABLE`` for the state and the input, or nothing) and
the effects list one input returns. The rules that use them are ``core.loop``,
``core.ending``, ``core.commands`` and ``core.session``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from ..agent.prompt import PromptBuilder
from ..config.models import SessionConfig
from ..messages.actions import RUNTIME_KINDS
from ..messages.events import (
    AgentState,
    CarriesCommand,
    Event,
    PromptCondensed,
    RuntimeEvent,
    StateChanged,
)
from ..messages.protocol import (
    Complete,
)
from ..security.masking import SecretMasker
from .effects import (
    Append,
    Effect,
)
from .fold import SessionView
from .states import AS_BEFORE, STAY, Why, row_for
from .stuck import StuckWatch

logger = logging.getLogger(__name__)

BACK_AFTER_SANDBOX = "the sandbox is back; carrying on"


def random_id() -> str:
    return uuid.uuid4().hex


TAKEN_KEPT = 256
"""User commands a core remembers having carried out (a command is handed again within
moments of its taker's death, never hundreds of commands later)."""


class SessionMachine:
    """The state of one session and the means to change it.

    Args:
        session_id, config: the session.
        masker: every value to keep out of the log and the prompt (secrets and the
            credentials trouper holds); revealer: only the placeholders an action may use.
        instructions: the workspace's AGENTS.md text, read by the adapter.
        new_id: random ids (request, turn and action ids are cut from it); tests pass a
            counter.
    """

    def __init__(
        self,
        session_id: str,
        config: SessionConfig,
        *,
        masker: SecretMasker | None = None,
        revealer: SecretMasker | None = None,
        instructions: str | None = None,
        new_id: Callable[[], str] = random_id,
    ) -> None:
        self.session_id, self.config = session_id, config
        self.masker = masker or SecretMasker({})
        self.revealer = revealer or SecretMasker({})
        self.new_id = new_id
        self.view = SessionView()
        self.prompt = PromptBuilder(  # the prompt leaves trouper: masked like the log
            system_prompt=self._masked(config.system_prompt),
            workspace_instructions=self._masked(instructions))
        self.cut = 0
        self.summary = ""
        """The summary the latest condensation recorded of what it dropped ("" for none)."""
        self.summarizing: int | None = None
        """The cut the summary request in flight (``llm_request``) is for."""
        self.stuck = StuckWatch()
        """The agent's recent steps, for stuck detection (``core/stuck.py``)."""
        self._tools: list[dict[str, Any]] = []
        self._tools_for: object = None
        """The tools offered with the MCP servers' (``SessionLoop._offered_tools``), and
        the view's ``mcp_tools`` they were built from."""
        self.runtime_ready = False
        self.runtime_down = False
        self.llm_request: Complete | None = None
        self.dispatched: str | None = None
        self.resolve_first: set[str] = set()
        self.condensed_retry = False
        self.lift_token = 0
        self.taken: dict[str, int] = {}
        """The latest user commands carried out: ``command_id`` -> the seq of the event
        that names it, oldest first. One handed again (its taker died, or a client sent
        it again under the same idempotency key) is answered, not carried out twice."""
        self.command_id: str | None = None
        """The user command being carried out, until its first event is appended."""
        self.lift_cooldown = False
        self.back_reason = BACK_AFTER_SANDBOX
        self.interrupted: tuple[AgentState, str, datetime | None] | None = None
        """Where a store fault found the session (state, reason, ``resumes_at``), from its
        record (``store_fault``) until ``store_back`` returns there."""
        self.ending = False
        """An ``EndSandbox`` was asked and its ``SandboxEnded`` has not come."""
        self.sandbox_ended = False
        """The log's last word on the sandbox is that it was ended (``RuntimeEvent``
        ``closed``), and no fresh one was asked for since."""
        self._out: list[Effect] = []
        self._now: datetime | None = None

    # -- building ------------------------------------------------------------------

    def restore(self, events: Iterable[Event]) -> int:
        """Fold a stored log in (a fresh core only); what was in flight is forgotten and
        its outcome asked of the journal first. Returns how many events there were."""
        count = 0
        for event in events:
            self._fold(event)
            count += 1
        self.dispatched, self.llm_request, self.summarizing = None, None, None
        self.resolve_first = self._runtime_pending()
        return count


    def _step(self, now: datetime) -> _Step:
        return _Step(self, now)

    def _take(self) -> list[Effect]:
        out, self._out = self._out, []
        return out

    @property
    def now(self) -> datetime:
        assert self._now is not None, "the core runs only inside a step"
        return self._now

    # -- the log -----------------------------------------------------------------------

    def _append(self, *events: Event) -> None:
        """Mask, stamp (seq and time) and fold in; the adapter makes it durable."""
        stamped = []
        events = self._marked(events)
        for i, event in enumerate(events, 1):
            masked = self.masker.mask_event(event)
            stamped.append(masked.model_copy(update={"seq": self.view.last_seq + i,
                                                     "ts": self.now}))
        for event in stamped:
            self._fold(event)
        self._out.append(Append(tuple(stamped)))

    def _marked(self, events: tuple[Event, ...]) -> tuple[Event, ...]:
        """``events`` with the command being carried out named on the first that can
        carry it: in the same append as what it did, so the log says it was done."""
        if self.command_id is None:
            return events
        for i, event in enumerate(events):
            if isinstance(event, CarriesCommand):
                marked = event.model_copy(update={"command_id": self.command_id})
                self.command_id = None
                return events[:i] + (marked,) + events[i + 1:]
        return events

    def _fold(self, event: Event) -> None:
        self.view.apply(event)
        self.stuck.add(event)
        if isinstance(event, CarriesCommand) and event.command_id is not None:
            self.taken[event.command_id] = event.seq
            if len(self.taken) > TAKEN_KEPT:
                del self.taken[next(iter(self.taken))]
        if isinstance(event, PromptCondensed):
            self.cut = max(self.cut, event.cut)
            self.summary = event.summary
        elif isinstance(event, RuntimeEvent) and event.phase in ("closed", "started",
                                                                  "attached"):
            self.sandbox_ended = event.phase == "closed"
        self.prompt.add(event)

    def _move(self, why: Why, reason: str = "", resumes_at: datetime | None = None,
              along: Sequence[Event] = (), back_to: AgentState | None = None) -> bool:
        """Take ``why``'s row from the current state (``core.states.TABLE``): record the
        move, ``along`` in the same append (so a crash never leaves their outcomes without
        the state they belong to), then do what the row says follows. A state and input
        with no row are refused here, and only here: logged and skipped, ``along`` still
        recorded (outcomes owed whatever the state). ``back_to``: the target of an
        ``AS_BEFORE`` row. False when refused."""
        view = self.view
        row = row_for(view.state, why)
        if row is None:
            logger.info("session %s: %s does not move a session that is %s; skipped",
                        self.session_id, why.value, view.state.value)
            if along:
                self._append(*along)
            return False
        to = view.state if row.to is STAY else back_to if row.to is AS_BEFORE else row.to
        assert isinstance(to, AgentState), f"{why.value}: a row back to where, from {to}?"
        if row.to is STAY or (view.state, view.reason, view.resumes_at) == (
                to, reason, resumes_at):
            if along:
                self._append(*along)
        else:
            logger.info("session %s: %s -> %s (%s)", self.session_id, view.state.value,
                        to.value, reason)
            self._append(*along, StateChanged(state=to, reason=reason, cause=why,
                                              resumes_at=resumes_at))
        for step in row.then:
            getattr(self, step.value)()
        return True

    def _masked(self, text: str | None) -> str | None:
        return None if text is None else self.masker.mask_text(text)

    def _runtime_pending(self) -> set[str]:
        return {action_id for action_id, event in self.view.pending.items()
                if event.action is not None and event.action.kind in RUNTIME_KINDS}


class _Step:
    """Sets the core's ``now`` for one input (the core has no clock of its own)."""

    def __init__(self, core: SessionMachine, now: datetime) -> None:
        self.core, self.now = core, now

    def __enter__(self) -> None:
        self.core._now = self.now  # noqa: SLF001

    def __exit__(self, *exc: object) -> None:
        self.core._now = None  # noqa: SLF001

