"""Stuck detection: an agent that makes no progress is paused, never killed.

``StuckWatch`` is a fold over the session's log, fed every event the core folds (so a
Controller restored from the log holds the same window and reaches the same verdict).
Its window starts after the user's latest word (a message, a resume) or the latest
``stuck`` pause, so one loop pauses a session once: after the user's hint, only what the
agent does next counts.

The patterns, checked before the agent is asked for its next step:

- ``repeat``: the same action with the same outcome, ``repeat`` times in a row;
- ``error``: the same action failing with the same error, ``error_repeat`` times in a row;
- ``alternate``: two actions and their outcomes taking turns, ``alternate`` actions long
  (A, B, A, B, A, B);
- ``think``: ``think`` actions and nothing else, ``think`` in a row (a monologue: a reply
  with no action moves the session to the user anyway);
- ``condense``: the prompt condensed ``condense`` times with no action in between.

A legitimate wait is not a loop: a ``run`` that polls a command still running (an empty
command, or an outcome that says the command goes on) neither counts nor breaks a run,
and the same command with a different output (a build making progress) is not a repeat.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from dataclasses import dataclass

from ..config.models import StuckPolicy
from ..messages.events import (
    ActionEvent,
    Event,
    MessageEvent,
    ObservationEvent,
    PromptCondensed,
    StateChanged,
)
from .states import Why

_KEPT = 64
"""Steps the window keeps (more than any threshold needs)."""


@dataclass(frozen=True)
class Step:
    """One action and its outcome, as the watch compares them."""

    seq: int
    action: str
    """The tool and its arguments, normalised (key order, whitespace)."""
    shown: str
    """The action as a reason names it."""
    outcome: str
    """A digest of the outcome: its status, exit code and text."""
    failed: bool
    think: bool


class StuckWatch:
    """The recent steps of a session since the user's latest word (see the module doc)."""

    def __init__(self) -> None:
        self.steps: deque[Step] = deque(maxlen=_KEPT)
        self.condensed = 0
        """Condensations since the latest action."""
        self._actions: dict[str, ActionEvent] = {}

    def add(self, event: Event) -> None:
        """Fold one event of the log in."""
        if isinstance(event, ActionEvent):
            self._actions[event.action_id] = event
            self.condensed = 0
        elif isinstance(event, ObservationEvent):
            action = self._actions.pop(event.action_id, None)
            if action is not None and action.source == "agent":
                step = _step_of(action, event)
                if step is not None:
                    self.steps.append(step)
        elif isinstance(event, PromptCondensed):
            self.condensed += 1
        elif (isinstance(event, MessageEvent) and event.source == "user") or (
                isinstance(event, StateChanged)
                and event.cause in (Why.USER_RESUME, Why.STUCK, Why.USER_MESSAGE)):
            self.steps.clear()
            self.condensed = 0

    def verdict(self, policy: StuckPolicy) -> str | None:
        """Why the agent is stuck, naming the pattern and the actions (by seq); None
        when it is not (or detection is off)."""
        if not policy.enabled:
            return None
        steps = list(self.steps)
        return (_repeat(steps, policy.error_repeat, failed=True)
                or _repeat(steps, policy.repeat, failed=False)
                or _alternate(steps, policy.alternate)
                or _thinking(steps, policy.think)
                or _condensing(self.condensed, policy.condense))


def _step_of(action: ActionEvent, observation: ObservationEvent) -> Step | None:
    """The step to compare, or None for a poll of a command still running."""
    outcome = observation.outcome
    parsed = action.action
    command = getattr(parsed, "command", None)
    if outcome.still_running or (parsed is not None and parsed.kind == "run"
                                 and command is not None and not command.strip()):
        return None
    try:
        arguments = json.dumps(json.loads(action.arguments or "{}"), sort_keys=True)
    except ValueError:
        arguments = " ".join(action.arguments.split())
    text = f"{outcome.status}\0{outcome.exit_code}\0{outcome.content}"
    shown = f"{action.tool} {command}" if command else action.tool
    return Step(seq=action.seq, action=f"{action.tool}\0{arguments}",
                shown=" ".join(shown.split())[:120],
                outcome=hashlib.sha256(text.encode()).hexdigest(),
                failed=outcome.status != "ok" or outcome.exit_code not in (None, 0),
                think=action.tool == "think")


def _seqs(steps: list[Step]) -> str:
    return ", ".join(str(s.seq) for s in steps)


def _repeat(steps: list[Step], times: int, *, failed: bool) -> str | None:
    if times < 2 or len(steps) < times:
        return None
    last = steps[-times:]
    first = last[0]
    if any((s.action, s.outcome) != (first.action, first.outcome) for s in last):
        return None
    if failed:
        if not first.failed:
            return None
        return (f"stuck: the same action failed the same way {times} times in a row: "
                f"{first.shown} (actions at seq {_seqs(last)})")
    return (f"stuck: the same action gave the same result {times} times in a row: "
            f"{first.shown} (actions at seq {_seqs(last)})")


def _alternate(steps: list[Step], length: int) -> str | None:
    if length < 4 or len(steps) < length:
        return None
    last = steps[-length:]
    a, b = last[0], last[1]
    if (a.action, a.outcome) == (b.action, b.outcome):
        return None
    for i, step in enumerate(last):
        expected = a if i % 2 == 0 else b
        if (step.action, step.outcome) != (expected.action, expected.outcome):
            return None
    return (f"stuck: alternating between two actions with the same results, {length} "
            f"times: {a.shown} / {b.shown} (actions at seq {_seqs(last)})")


def _thinking(steps: list[Step], times: int) -> str | None:
    if times < 2 or len(steps) < times or not all(s.think for s in steps[-times:]):
        return None
    return (f"stuck: {times} thoughts in a row and no other action (actions at seq "
            f"{_seqs(steps[-times:])})")


def _condensing(condensed: int, times: int) -> str | None:
    if times < 1 or condensed < times:
        return None
    return (f"stuck: the context was condensed {condensed} times in a row with no action "
            "in between")
