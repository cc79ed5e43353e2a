"""Every way a session's state can change, written down once.

Each ``Why`` (in ``messages/events.py``: every ``StateChanged`` records its own) names one
transition: the states it may start from and the state it leads to. The core refuses
(logs and skips) a transition from a state its row does not list, so a late or
out-of-order input can never move a session where it should not be.
``docs/architecture.md`` draws this table.
"""

from __future__ import annotations

from ..messages.events import AgentState, Why

S = AgentState
ANY = frozenset(AgentState)

RESUMABLE = frozenset({S.PAUSED, S.ERROR, S.STOPPED, S.RATE_LIMITED, S.AWAITING_USER_INPUT,
                       S.AWAITING_USER_CONFIRMATION})
"""States a user's resume moves back to RUNNING."""

ENDS_SANDBOX = frozenset({S.STOPPED})
"""States whose sandbox is ended as the session enters them (the shell, its jobs, the
container): leaving one starts a fresh sandbox. The other settled states keep theirs
until the session stands down (``settled_stand_down_s``)."""


TRANSITIONS: dict[Why, tuple[frozenset[AgentState], AgentState | None]] = {
    Why.RUNTIME_READY: (frozenset({S.LOADING}), S.RUNNING),
    Why.RUNTIME_FAILED: (frozenset({S.RUNNING}), S.ERROR),
    Why.RUNTIME_DOWN: (frozenset({S.LOADING, S.RUNNING, S.ERROR}), S.ERROR),
    Why.RECOVERED: (frozenset({S.ERROR}), S.RUNNING),
    Why.RECOVERED_HELD: (frozenset({S.ERROR}), S.ERROR),
    Why.MAX_ITERATIONS: (frozenset({S.RUNNING}), S.STOPPED),
    Why.MAX_COST: (frozenset({S.RUNNING}), S.STOPPED),
    Why.FINISHED: (frozenset({S.RUNNING}), S.FINISHED),
    Why.BREAKER: (frozenset({S.RUNNING}), S.PAUSED),
    Why.TEXT_REPLY: (frozenset({S.RUNNING}), S.AWAITING_USER_INPUT),
    Why.RATE_LIMITED: (frozenset({S.RUNNING}), S.RATE_LIMITED),
    Why.LIMIT_LIFTED: (frozenset({S.RATE_LIMITED}), S.RUNNING),
    Why.MODEL_FAILED: (frozenset({S.RUNNING}), S.ERROR),
    Why.JOURNAL_FAULT: (frozenset({S.RUNNING}), S.ERROR),
    Why.JOURNAL_BACK: (frozenset({S.ERROR}), S.RUNNING),
    Why.USER_MESSAGE: (ANY - {S.PAUSED, S.RUNNING, S.LOADING}, S.RUNNING),
    Why.USER_PAUSE: (ANY - {S.FINISHED, S.STOPPED, S.PAUSED}, S.PAUSED),
    Why.USER_RESUME: (RESUMABLE, S.RUNNING),
    Why.USER_STOP: (ANY - {S.STOPPED}, S.STOPPED),
    Why.STORE_BACK: (ANY, None),  # back to the state the fault interrupted
    Why.AWAITING_CONFIRMATION: (frozenset({S.RUNNING}), S.AWAITING_USER_CONFIRMATION),
    Why.USER_APPROVE: (frozenset({S.AWAITING_USER_CONFIRMATION}), S.RUNNING),
    Why.USER_REJECT: (frozenset({S.AWAITING_USER_CONFIRMATION}), S.RUNNING),
    Why.SETUP_FAILED: (frozenset({S.RUNNING, S.ERROR}), S.ERROR),  # ERROR: lost in recovery
    Why.LOOP_DOWN: (ANY - {S.FINISHED, S.STOPPED}, S.ERROR),  # the Controller gave up
}
"""``why -> (states it may start from, state it leads to)``."""


def allowed(why: Why, state: AgentState, to: AgentState) -> bool:
    """May ``why`` move a session from ``state`` to ``to``?"""
    sources, target = TRANSITIONS[why]
    return state in sources and (target is None or target == to)


def table() -> list[tuple[str, str, str]]:
    """``(why, from states, to state)`` rows, for the docs."""
    rows = []
    for why, (sources, target) in TRANSITIONS.items():
        names = "any" if sources == ANY else ", ".join(sorted(s.value for s in sources))
        rows.append((why.value, names, target.value if target else "(as before)"))
    return rows


def markdown_table() -> str:
    """The table as ``docs/architecture.md`` shows it (a test keeps the two equal)."""
    lines = ["| why | from | to |", "|---|---|---|"]
    lines += [f"| `{why}` | {sources} | {target} |" for why, sources, target in table()]
    return "\n".join(lines)
