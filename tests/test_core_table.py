"""The session core's table (``core/states.py``): the rows drive every move, the state
sets live there alone, and the Controller's own faults go through it. (The refusal of a
pair with no row and the docs' diagram are checked in ``test_core_session.py``.)

Each test runs the core on a fake clock, as ``test_core_session.py`` does (its helpers).
"""

from __future__ import annotations

import ast
import itertools
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_core_session import (  # noqa: E402
    T0,
    Clock,
    S,
    _log_of,
    answer,
    appended,
    call,
    command,
    make,
    only,
    running,
    stop,
)

from trouper.core.effects import (  # noqa: E402
    Answer,
    AskModel,
    EndSandbox,
    RestartRuntime,
    SandboxEnded,
    StartTimer,
    TimerFired,
)
from trouper.core.session import SessionCore  # noqa: E402
from trouper.core.states import (  # noqa: E402
    AS_BEFORE,
    ENDS_SANDBOX,
    RESTORABLE,
    RESUMABLE,
    SETTLED,
    TABLE,
    Then,
    Why,
    settled,
)
from trouper.messages.events import MessageEvent, StateChanged  # noqa: E402
from trouper.messages.protocol import (  # noqa: E402
    CompletionFailed,
    UserCommand,
)

ROOT = Path(__file__).resolve().parent.parent
USERS = {Why.USER_MESSAGE, Why.USER_PAUSE, Why.USER_RESUME, Why.USER_STOP,
         Why.USER_APPROVE, Why.USER_REJECT, Why.USER_BUDGET, Why.USER_INTERRUPT}
FAULTS = {Why.LOOP_DOWN, Why.STORE_FAULT}


REQUESTS = itertools.count(1)


def say(core: SessionCore, clock: Clock, name: str, text: str = "") -> tuple[Any, list]:
    """A user's command under a request id of its own (``command`` reuses one a name)."""
    effects = core.handle(UserCommand(request_id=f"r-{next(REQUESTS)}", session_id="s-1",
                                      command=name, text=text), clock.tick())
    if [e for e in effects if isinstance(e, EndSandbox)]:  # a stop's answer waits for it
        effects += core.handle(SandboxEnded(), clock.tick())
    return only(effects, Answer), effects


def moves(state: S) -> dict[Why, S]:
    """The rows of ``state`` that go to a state of their own (not STAY, not AS_BEFORE)."""
    return {why: row.to for why, row in TABLE[state].items() if isinstance(row.to, S)}


# -- the table's shape ---------------------------------------------------------------------


def test_every_input_has_a_row_and_every_step_is_a_method_of_the_core():
    assert set(TABLE) == set(S)
    assert {why for rows in TABLE.values() for why in rows} == set(Why)
    for step in Then:
        assert callable(getattr(SessionCore, step.value, None)), step
    for state in S:  # a message is always recorded, a stop always taken (neither is ever
        # refused, so neither records what it carries without its answer saying so), and
        # a store fault can strike anywhere
        assert {Why.USER_MESSAGE, Why.USER_STOP, Why.STORE_FAULT} <= set(TABLE[state]), state


def test_the_rules_a_reader_can_rely_on():
    for state, rows in TABLE.items():
        for why, row in rows.items():
            if row.to == S.RUNNING:
                assert Then.ADVANCE in row.then, (state, why)  # RUNNING takes the next step
            if row.to in ENDS_SANDBOX and state not in ENDS_SANDBOX:
                assert Then.END_SANDBOX in row.then, (state, why)
            leaves = isinstance(row.to, S) and row.to not in ENDS_SANDBOX
            if state in ENDS_SANDBOX and leaves and why != Why.STORE_FAULT:
                assert Then.FRESH_SANDBOX in row.then, (state, why)
            if row.to is AS_BEFORE:  # wherever it goes back to, what that state needs
                assert {Then.END_SANDBOX, Then.LIFT_TIMER} <= set(row.then), (state, why)
    assert [why for rows in TABLE.values() for why, row in rows.items()
            if row.to is AS_BEFORE] == [Why.STORE_BACK]


# -- the state sets ---------------------------------------------------------------------------


def test_the_state_sets_agree_with_the_table():
    for state in SETTLED - {S.ERROR}:  # only the user (or a fault) moves it
        assert set(moves(state)) <= USERS | FAULTS, (state, moves(state))
    for state in set(S) - SETTLED:  # something moves it by itself
        assert set(moves(state)) - USERS - FAULTS, state
    assert RESUMABLE == {S.PAUSED, S.ERROR, S.STOPPED, S.RATE_LIMITED,
                         S.AWAITING_USER_INPUT, S.AWAITING_USER_CONFIRMATION}
    assert RESTORABLE == {S.LOADING, S.RUNNING, S.RATE_LIMITED, S.ERROR}
    assert settled(S.ERROR, None) and not settled(S.ERROR, T0)
    assert not settled(S.RATE_LIMITED, None)
    for state in S:
        assert StateChanged(state=state).settled is settled(state, None)


def _state_lists(path: Path) -> list[int]:
    """Lines of ``path`` that spell out a set, tuple or list of two states or more."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Set | ast.Tuple | ast.List):
            states = [e for e in node.elts if isinstance(e, ast.Attribute)
                      and isinstance(e.value, ast.Name) and e.value.id == "AgentState"]
            if len(states) >= 2:
                found.append(node.lineno)
    return found


def _product_modules() -> list[Path]:
    """Every module of the package (tests, bench and hidden folders left out)."""
    modules = []
    for folder, subfolders, files in os.walk(ROOT):
        here = Path(folder)
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "__pycache__"
                         and not (here == ROOT and d in {"tests", "bench", "build"})]
        modules += [here / name for name in files if name.endswith(".py")]
    return modules


def test_the_state_sets_have_one_home(tmp_path):
    """No product module but ``core/states.py`` spells out states: it imports the sets."""
    lists = {str(path.relative_to(ROOT)): lines for path in _product_modules()
             if path != ROOT / "core" / "states.py" and (lines := _state_lists(path))}
    assert lists == {}
    probe = tmp_path / "probe.py"  # the check finds one
    probe.write_text("from trouper import AgentState\n"
                     "X = frozenset({AgentState.PAUSED, AgentState.ERROR})\n"
                     "ok = state in (AgentState.LOADING, AgentState.RUNNING)\n")
    assert _state_lists(probe) == [2, 3]


# -- refused in one place ---------------------------------------------------------------------


def test_a_lift_timer_that_fires_after_a_resume_moves_nothing():
    core, clock, ask = running()
    effects = core.handle(CompletionFailed(request_id=ask.request.request_id, session_id="s-1",
                                           error_class="rate_limit", message="429",
                                           retry_after_s=30), clock.tick())
    timer = only(effects, StartTimer)
    reply, effects = command(core, clock, "resume")
    only(effects, AskModel)
    assert core.handle(TimerFired("lift", timer.token), clock.tick(30)) == []
    assert core.view.state == S.RUNNING


def test_a_command_without_a_row_is_refused_in_words_and_records_nothing():
    core, clock, _ = running()
    say(core, clock, "pause")
    seq = core.view.last_seq
    reply, _ = say(core, clock, "pause")
    assert reply.error == "cannot pause a session that is paused" and core.view.last_seq == seq
    reply, effects = say(core, clock, "send", "look at the parser first")
    assert reply.error is None and core.view.state == S.PAUSED  # a STAY row: recorded
    assert [type(e) for e in appended(effects)] == [MessageEvent]
    reply, effects = say(core, clock, "resume")
    assert core.view.state == S.RUNNING
    reply, effects = say(core, clock, "resume")
    assert reply.error is None and appended(effects) == []  # running: nothing to resume
    stop(core, clock)
    core.handle(SandboxEnded(), clock.tick())
    seq = core.view.last_seq
    reply, effects = say(core, clock, "stop")
    assert reply.error is None and core.view.last_seq == seq


# -- the Controller's own faults go through the table ----------------------------------------


def test_the_agent_loop_down_is_a_row_of_the_table_masked_like_any_record():
    core, clock, _ = running()
    log = _log_of(core)
    stand_in, _ = make(secrets={"TOKEN": "s3cr3t-value"})  # as the stand-in builds it
    stand_in.restore(log)
    back = clock.now + timedelta(seconds=60)
    effects = stand_in.loop_down("gave up (s3cr3t-value)", back, clock.tick())
    [down] = appended(effects)
    assert (down.state, down.cause, down.resumes_at) == (S.ERROR, Why.LOOP_DOWN, back)
    assert down.seq == log[-1].seq + 1 and "s3cr3t-value" not in down.reason

    answer_core, clock, ask = running()
    answer(answer_core, ask, clock, call("finish", message="done"))
    over, _ = make()
    over.restore(_log_of(answer_core))
    assert over.loop_down("gave up", None, clock.tick()) == []  # a finished session is over
    assert over.view.state == S.FINISHED


def test_a_store_fault_is_a_row_and_back_from_it_a_stopped_session_keeps_its_end():
    """The fault's ERROR leaves STOPPED without a fresh sandbox (only a resume or a
    message start one), and the way back returns to STOPPED as it was."""
    core, clock, _ = running()
    stop(core, clock)
    core.handle(SandboxEnded(), clock.tick())
    fresh, _ = make()
    fresh.restore(_log_of(core))
    effects = fresh.store_fault("the disk is full", clock.now, clock.tick())
    assert [(e.state, e.cause) for e in appended(effects)] == [(S.ERROR, Why.STORE_FAULT)]
    effects += fresh.store_back(clock.tick())
    assert fresh.view.state == S.STOPPED and fresh.view.reason == "stopped by the user"
    assert not [e for e in effects if isinstance(e, RestartRuntime)]
    assert not [e for e in appended(effects) if isinstance(e, MessageEvent)]  # no reset


def test_back_from_a_store_fault_a_rate_limited_session_waits_for_its_timer_again():
    core, clock, ask = running()
    core.handle(CompletionFailed(request_id=ask.request.request_id, session_id="s-1",
                                 error_class="rate_limit", message="429", retry_after_s=30),
                clock.tick())
    lifts_at = core.view.resumes_at
    fresh, _ = make()
    fresh.restore(_log_of(core))
    fresh.store_fault("the disk is full", clock.now, clock.tick())
    effects = fresh.store_back(clock.tick())
    assert (fresh.view.state, fresh.view.resumes_at) == (S.RATE_LIMITED, lifts_at)
    assert only(effects, StartTimer).delay_s == (lifts_at - clock.now).total_seconds()
