"""A session's states, and the table that moves it between them: everything that decides
a state change lives in this file.

The table (``TABLE``) has one row per state and input the core handles: the input is a
``Why``, the name of what happened as the core reads it (a ``CompletionFailed`` whose
class is ``rate_limit`` is ``RATE_LIMITED``; any other is ``MODEL_FAILED``), stored with
the change it makes (``StateChanged.cause``). A row gives the next state and what the core
does after recording it (``Then``: the names of the small functions that compute the
effects from the session's data, such as which model call to cancel or which timer to
start). The core reads the row (``SessionMachine._move``); a state and input with no row
is refused there, and only there (logged and skipped), so a late or out-of-order input
can never move a session where it should not go.

Two targets are not a state of their own: ``STAY`` (the input is taken, and the session
stays where it is: a user's message to a paused session) and ``AS_BEFORE`` (back to the
state a store fault interrupted, which only the input knows). The outcomes a move
records in the same append (the rest of a turn rejected by a finish, what never ran
before a stop) depend on the input too: the handler computes them and hands them to the
move, which records them whether or not it moves.

``docs/architecture.md`` draws this table (``diagram()``; a test keeps the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum, StrEnum


class AgentState(StrEnum):
    """Where a session is in its life (``TABLE`` below moves it)."""

    LOADING = "loading"
    RUNNING = "running"
    AWAITING_USER_INPUT = "awaiting_user_input"
    AWAITING_USER_CONFIRMATION = "awaiting_user_confirmation"
    PAUSED = "paused"
    RATE_LIMITED = "rate_limited"
    ERROR = "error"
    FINISHED = "finished"
    STOPPED = "stopped"


class Why(StrEnum):
    """What moved a session: the input of a row of ``TABLE``. Stored with the change, so
    code reads the cause, never the words of the reason."""

    RUNTIME_READY = "runtime_ready"  # the first sandbox is up
    RUNTIME_FAILED = "runtime_failed"  # the sandbox or its proxy died; being restarted
    RUNTIME_DOWN = "runtime_down"  # its supervisor gave up on the sandbox
    RUNTIME_MISCONFIGURED = "runtime_misconfigured"  # it cannot work as configured: no retry
    RECOVERED = "recovered"  # a sandbox is back after a failure: carry on
    RECOVERED_HELD = "recovered_held"  # ... but resume_after_runtime_restart is off
    MAX_ITERATIONS = "max_iterations"
    MAX_COST = "max_cost"
    BUDGET_ASK = "budget_ask"  # a budget ran out and on_budget is "ask": the user decides
    USER_BUDGET = "user_budget"  # the user raised the budget a session paused for
    FINISHED = "finished"  # the agent called finish
    BREAKER = "breaker"  # too many commands in a row timed out
    STUCK = "stuck"  # the agent repeats itself without progress (core/stuck.py)
    TEXT_REPLY = "text_reply"  # the model answered with text only
    RATE_LIMITED = "rate_limited"  # the broker's retries were spent on 429s
    LIMIT_LIFTED = "limit_lifted"  # the rate limit's timer fired
    MODEL_FAILED = "model_failed"  # a model call failed for good
    JOURNAL_FAULT = "journal_fault"  # the sandbox cannot journal the action it was sent
    JOURNAL_BACK = "journal_back"  # ... and now it can
    USER_MESSAGE = "user_message"
    USER_INTERRUPT = "user_interrupt"  # a message that cancels the model call in flight
    USER_PAUSE = "user_pause"
    USER_RESUME = "user_resume"
    USER_STOP = "user_stop"
    STORE_FAULT = "store_fault"  # the store took no write for a while (disk full...)
    STORE_BACK = "store_back"  # ... and takes writes again
    LOOP_DOWN = "loop_down"  # the supervisor gave up on the Controller (the agent loop)
    AWAITING_CONFIRMATION = "awaiting_confirmation"  # the policy holds an action
    USER_APPROVE = "user_approve"
    USER_REJECT = "user_reject"
    SETUP_FAILED = "setup_failed"  # the clone or the setup script failed


S = AgentState
ANY = frozenset(AgentState)

# -- the state sets: every other module imports these ------------------------------------

SETTLED = frozenset({S.FINISHED, S.STOPPED, S.PAUSED, S.AWAITING_USER_INPUT,
                     S.AWAITING_USER_CONFIRMATION, S.ERROR})
"""States in which a session will not move again without the user, unless it carries a
``resumes_at`` (an ERROR being recovered): see ``settled``."""

RESTORABLE = (ANY - SETTLED) | {S.ERROR}
"""States whose sessions a program carries on when it opens its home: one still working,
or an ERROR (a session's record does not say whether it was recovering)."""

ENDS_SANDBOX = frozenset({S.STOPPED})
"""States whose sandbox is ended as the session enters them (the shell, its jobs, the
container): leaving one starts a fresh sandbox. The other settled states keep theirs
until the session stands down (``settled_stand_down_s``)."""


def settled(state: AgentState, resumes_at: datetime | None) -> bool:
    """Will a session in ``state`` (resuming by itself at ``resumes_at``) stay there until
    the user acts? ``Session.wait()`` returns then."""
    return state in SETTLED and resumes_at is None


# -- the table -------------------------------------------------------------------------


class Then(Enum):
    """What the core does after a move, in a row's order: each names the core's method
    that computes its effects from the session's data."""

    ADVANCE = "_advance"
    """Take the next step if RUNNING: the next action, else a question to the model."""
    CANCEL_MODEL = "_cancel_model_call"
    """Cancel the model call in flight (its answer would come to a session that left)."""
    LIFT_TIMER = "_schedule_lift"
    """A timer for ``resumes_at`` (RATE_LIMITED: the limit should have lifted then)."""
    SKIP_COOLDOWN = "_skip_cooldown"
    """The next model call goes through the API key's cooldown (the user said so)."""
    RESTART_SANDBOX = "_restart_given_up"
    """Start a fresh sandbox if the supervisor had given up on the last one."""
    END_SANDBOX = "_end_if_stopped"
    """End the sandbox (``ENDS_SANDBOX``), once nothing needs it first."""
    FRESH_SANDBOX = "_fresh_sandbox"
    """A fresh sandbox for a session that goes on after a stop; the agent is told."""


class Target(Enum):
    """A row's target that is not a state of its own."""

    STAY = "stays"
    """The input is taken and the session stays where it is (no change is recorded)."""
    AS_BEFORE = "as before"
    """Back to the state a store fault interrupted (the input names it)."""


STAY, AS_BEFORE = Target.STAY, Target.AS_BEFORE


@dataclass(frozen=True)
class Row:
    """Where an input moves a session from one state, and what follows."""

    to: AgentState | Target
    then: tuple[Then, ...] = ()

    def __init__(self, to: AgentState | Target, *then: Then) -> None:
        # ``Row(state, step, step)``: a line of the table reads as what it does
        object.__setattr__(self, "to", to)
        object.__setattr__(self, "then", then)


ADVANCE, CANCEL_MODEL, LIFT_TIMER = Then.ADVANCE, Then.CANCEL_MODEL, Then.LIFT_TIMER
SKIP_COOLDOWN, RESTART_SANDBOX = Then.SKIP_COOLDOWN, Then.RESTART_SANDBOX
END_SANDBOX, FRESH_SANDBOX = Then.END_SANDBOX, Then.FRESH_SANDBOX

GO_ON = Row(S.RUNNING, ADVANCE)
RESUME = Row(S.RUNNING, RESTART_SANDBOX, ADVANCE)
CARRY_ON = RESUME  # a user's word that carries the session on starts a sandbox down for good
PAUSE = Row(S.PAUSED, CANCEL_MODEL)
STOP = Row(S.STOPPED, CANCEL_MODEL, END_SANDBOX)
FAIL = Row(S.ERROR)
TAKE_MESSAGE = Row(STAY, ADVANCE)  # recorded; the agent reads it at its next step
INTERRUPT = Row(STAY, CANCEL_MODEL, ADVANCE)  # recorded; the model is asked anew with it

TABLE: dict[AgentState, dict[Why, Row]] = {
    S.LOADING: {
        Why.RUNTIME_READY: GO_ON,
        Why.RUNTIME_DOWN: FAIL,
        Why.RUNTIME_MISCONFIGURED: FAIL,
        Why.USER_MESSAGE: TAKE_MESSAGE,
        Why.USER_RESUME: Row(STAY),
        Why.USER_PAUSE: PAUSE,
        Why.USER_STOP: STOP,
        Why.LOOP_DOWN: FAIL,
        Why.STORE_FAULT: FAIL,
    },
    S.RUNNING: {
        Why.TEXT_REPLY: Row(S.AWAITING_USER_INPUT),
        Why.AWAITING_CONFIRMATION: Row(S.AWAITING_USER_CONFIRMATION),
        Why.FINISHED: Row(S.FINISHED),
        Why.RATE_LIMITED: Row(S.RATE_LIMITED, LIFT_TIMER),
        Why.BREAKER: Row(S.PAUSED),
        Why.STUCK: Row(S.PAUSED),
        Why.MAX_ITERATIONS: Row(S.STOPPED, END_SANDBOX),
        Why.MAX_COST: Row(S.STOPPED, END_SANDBOX),
        Why.BUDGET_ASK: Row(S.PAUSED),
        Why.RUNTIME_FAILED: FAIL,
        Why.RUNTIME_DOWN: FAIL,
        Why.RUNTIME_MISCONFIGURED: FAIL,
        Why.JOURNAL_FAULT: FAIL,
        Why.MODEL_FAILED: FAIL,
        Why.SETUP_FAILED: FAIL,
        Why.USER_MESSAGE: TAKE_MESSAGE,
        Why.USER_INTERRUPT: INTERRUPT,
        Why.USER_RESUME: Row(STAY),
        Why.USER_PAUSE: PAUSE,
        Why.USER_STOP: STOP,
        Why.LOOP_DOWN: FAIL,
        Why.STORE_FAULT: FAIL,
    },
    S.AWAITING_USER_INPUT: {
        Why.USER_MESSAGE: CARRY_ON,
        Why.USER_RESUME: RESUME,
        Why.USER_PAUSE: PAUSE,
        Why.USER_STOP: STOP,
        Why.LOOP_DOWN: FAIL,
        Why.STORE_FAULT: FAIL,
    },
    S.AWAITING_USER_CONFIRMATION: {
        Why.USER_APPROVE: CARRY_ON,
        Why.USER_REJECT: CARRY_ON,
        Why.USER_MESSAGE: CARRY_ON,
        Why.USER_RESUME: RESUME,
        Why.USER_PAUSE: PAUSE,
        Why.USER_STOP: STOP,
        Why.LOOP_DOWN: FAIL,
        Why.STORE_FAULT: FAIL,
    },
    S.PAUSED: {
        Why.USER_MESSAGE: TAKE_MESSAGE,
        Why.USER_RESUME: RESUME,
        Why.USER_BUDGET: RESUME,
        Why.USER_STOP: STOP,
        Why.LOOP_DOWN: FAIL,
        Why.STORE_FAULT: FAIL,
    },
    S.RATE_LIMITED: {
        Why.LIMIT_LIFTED: GO_ON,
        Why.RUNTIME_MISCONFIGURED: FAIL,  # a sandbox restarted meanwhile
        Why.USER_MESSAGE: CARRY_ON,
        Why.USER_RESUME: Row(S.RUNNING, SKIP_COOLDOWN, RESTART_SANDBOX, ADVANCE),
        Why.USER_PAUSE: PAUSE,
        Why.USER_STOP: STOP,
        Why.LOOP_DOWN: FAIL,
        Why.STORE_FAULT: FAIL,
    },
    S.ERROR: {
        Why.RECOVERED: GO_ON,
        Why.RECOVERED_HELD: Row(S.ERROR),  # settles, waiting for the user
        Why.JOURNAL_BACK: GO_ON,
        Why.RUNTIME_DOWN: FAIL,
        Why.RUNTIME_MISCONFIGURED: FAIL,  # settles: no timer, the user fixes and resumes
        Why.SETUP_FAILED: FAIL,  # a setup step lost with its sandbox
        Why.STORE_BACK: Row(AS_BEFORE, LIFT_TIMER, END_SANDBOX),
        Why.USER_MESSAGE: CARRY_ON,
        Why.USER_RESUME: RESUME,
        Why.USER_PAUSE: PAUSE,
        Why.USER_STOP: STOP,
        Why.LOOP_DOWN: FAIL,
        Why.STORE_FAULT: FAIL,
    },
    S.FINISHED: {
        Why.USER_MESSAGE: CARRY_ON,
        Why.USER_STOP: STOP,
        Why.STORE_FAULT: FAIL,
    },
    S.STOPPED: {
        Why.USER_MESSAGE: Row(S.RUNNING, FRESH_SANDBOX, ADVANCE),
        Why.USER_RESUME: Row(S.RUNNING, FRESH_SANDBOX, ADVANCE),
        Why.USER_STOP: Row(STAY),
        Why.STORE_FAULT: FAIL,
    },
}
"""``state -> {why: row}``: every input that may move a session in that state."""


def row_for(state: AgentState, why: Why) -> Row | None:
    """The row of ``why`` in ``state``; None: it may not move a session that is there."""
    return TABLE[state].get(why)


def moves_from(why: Why) -> frozenset[AgentState]:
    """The states ``why`` moves a session out of (a ``STAY`` row is no move)."""
    return frozenset(state for state, rows in TABLE.items()
                     if why in rows and rows[why].to is not STAY)


RESUMABLE = moves_from(Why.USER_RESUME)
"""States a user's resume moves back to RUNNING (read from the table)."""


# -- the docs' drawing ------------------------------------------------------------------


def diagram() -> str:
    """The table as a mermaid state diagram, as ``docs/architecture.md`` shows it: one
    arrow per move, labelled with the inputs that make it (a ``STAY`` row is no move; an
    ``AS_BEFORE`` row is a note, since its target is the input's)."""
    lines = ["stateDiagram-v2", f"    [*] --> {S.LOADING.value}"]
    for state, rows in TABLE.items():
        arrows: dict[AgentState, list[str]] = {}
        for why, row in rows.items():
            if isinstance(row.to, AgentState):
                arrows.setdefault(row.to, []).append(why.value)
            elif row.to is AS_BEFORE:
                lines.append(f"    note right of {state.value} : {why.value} goes back to "
                             "the state the store fault interrupted")
        lines += [f"    {state.value} --> {to.value} : {', '.join(whys)}"
                  for to, whys in arrows.items()]
    return "\n".join(lines)
