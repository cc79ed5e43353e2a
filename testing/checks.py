"""Invariant checks over a session's log, for tests of trouper and of agents built on it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..messages.events import ActionEvent, AgentState, Event, ObservationEvent


def check_log(events: Sequence[Event], prompts: Sequence[Any] = ()) -> list[str]:
    """Every violation found in ``events`` (empty when the log keeps the promises).

    Checks: seq contiguous from 1; every action has exactly one outcome, and every
    outcome answers a known action (I1 in docs/promises.md); optionally, that no status event's text
    reached a prompt (``prompts``: the ``messages`` lists the model received).
    """
    problems: list[str] = []
    for index, event in enumerate(events, start=1):
        if event.seq != index:
            problems.append(f"seq {event.seq} at position {index}: the log is not contiguous")
            break
    actions = [e.action_id for e in events if isinstance(e, ActionEvent)]
    outcomes = Counter(e.action_id for e in events if isinstance(e, ObservationEvent))
    for action_id in actions:
        count = outcomes.get(action_id, 0)
        if count != 1:
            problems.append(f"action {action_id} has {count} outcomes (I1 wants exactly one)")
    for action_id in set(outcomes) - set(actions):
        problems.append(f"outcome for unknown action {action_id}")
    problems.extend(_status_in_prompts(events, prompts))
    return problems


def _status_in_prompts(events: Sequence[Event], prompts: Sequence[Any]) -> list[str]:
    found: list[str] = []
    markers = [
        getattr(e, "reason", "") or getattr(e, "message", "") or getattr(e, "detail", "")
        for e in events
        # a FINISHED reason repeats the agent's own finish message, which it may see
        if e.is_status and getattr(e, "state", None) != AgentState.FINISHED
    ]
    markers = [m for m in markers if len(m) >= 12]
    for number, messages in enumerate(prompts):
        text = repr(messages)
        for marker in markers:
            if marker in text:
                found.append(f"prompt {number} holds status text {marker[:40]!r} (I4)")
    return found
