"""Stuck detection in the session core, on a fake clock: each pattern pauses the session
with cause ``stuck`` and a reason naming it, a legitimate wait does not, a hint and a
resume carry the session on, and a core restored from the log decides alike, once."""

from __future__ import annotations

from typing import Any

from test_core_session import (
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
)

from trouper.config.models import StuckPolicy
from trouper.core.effects import AskModel, RunAction
from trouper.core.session import SessionCore
from trouper.core.states import Why
from trouper.core.stuck import StuckWatch
from trouper.messages.events import (
    ActionEvent,
    MessageEvent,
    ObservationEvent,
    PromptCondensed,
    StateChanged,
)
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import Executed, RuntimeReady


def step(core: SessionCore, ask: AskModel, clock: Clock, tool: str = "run",
         outcome: dict[str, Any] | None = None, **args: Any) -> AskModel | None:
    """The model asks for one action; it runs with ``outcome``; the next question, if
    the core asks one."""
    effects = answer(core, ask, clock, call(tool, **args))
    if tool == "think":
        asks = [e for e in effects if isinstance(e, AskModel)]
        return asks[0] if asks else None
    run = only(effects, RunAction)
    effects = core.handle(Executed(session_id="s-1", action_id=run.request.action_id,
                                   outcome=Outcome(**{"status": "ok", "content": "same",
                                                      **(outcome or {})})), clock.tick())
    asks = [e for e in effects if isinstance(e, AskModel)]
    return asks[0] if asks else None


def stuck_changes(core: SessionCore) -> list[StateChanged]:
    return [e for e in _log_of(core) if isinstance(e, StateChanged) and e.cause == Why.STUCK]


def test_the_same_action_with_the_same_result_four_times_pauses_naming_it():
    core, clock, ask = running()
    for _ in range(3):
        ask = step(core, ask, clock, command="pytest -x")
        assert ask is not None
    assert step(core, ask, clock, command="pytest -x") is None  # no fifth question
    assert core.view.state == S.PAUSED
    [change] = stuck_changes(core)
    assert "same result 4 times" in change.reason and "run pytest -x" in change.reason
    actions = [e.seq for e in _log_of(core) if isinstance(e, ActionEvent)]
    assert f"seq {', '.join(map(str, actions))}" in change.reason
    assert "send a hint and resume" in change.reason


def test_the_same_error_three_times_pauses_sooner():
    core, clock, ask = running()
    failing = {"status": "ok", "content": "ModuleNotFoundError: foo", "exit_code": 1}
    for _ in range(2):
        ask = step(core, ask, clock, outcome=failing, command="python app.py")
    assert step(core, ask, clock, outcome=failing, command="python app.py") is None
    assert "failed the same way 3 times" in stuck_changes(core)[0].reason


def test_a_build_making_progress_and_a_command_polled_for_its_output_are_not_loops():
    core, clock, ask = running()
    for i in range(8):  # the same command, a different output each time
        ask = step(core, ask, clock, outcome={"content": f"built {i} of 9"}, command="make")
        assert ask is not None
    for _ in range(8):  # waiting on a long command: an empty run, still running
        ask = step(core, ask, clock, outcome={"content": "...", "still_running": True},
                   command="")
        assert ask is not None
    assert core.view.state == S.RUNNING and not stuck_changes(core)


def test_two_actions_taking_turns_pause_after_six():
    core, clock, ask = running()
    for i in range(5):
        ask = step(core, ask, clock, command="git stash" if i % 2 == 0 else "git stash pop")
        assert ask is not None
    assert step(core, ask, clock, command="git stash pop") is None
    reason = stuck_changes(core)[0].reason
    assert "alternating between two actions" in reason and "run git stash pop" in reason


def test_thoughts_and_no_action_pause_after_six():
    core, clock, ask = running()
    for i in range(5):
        ask = step(core, ask, clock, tool="think", thought=f"let me think {i % 2}")
        assert ask is not None
    assert step(core, ask, clock, tool="think", thought="hmm") is None
    assert "6 thoughts in a row" in stuck_changes(core)[0].reason


def test_condensing_again_and_again_with_no_action_is_a_loop():
    watch, policy = StuckWatch(), StuckPolicy()
    for i in range(2):
        watch.add(PromptCondensed(seq=i + 1, cut=10 + i, dropped=5))
    assert watch.verdict(policy) is None
    watch.add(PromptCondensed(seq=3, cut=12, dropped=5))
    assert "condensed 3 times" in (watch.verdict(policy) or "")
    watch.add(ActionEvent(seq=4, action_id="a1", turn_id="t", tool_call_id="c", tool="run",
                          arguments="{}"))
    assert watch.verdict(policy) is None


def test_a_hint_and_a_resume_carry_on_and_only_a_new_loop_pauses_again():
    core, clock, ask = running()
    for _ in range(4):
        ask = step(core, ask, clock, command="pytest -x") or ask
    assert core.view.state == S.PAUSED
    command(core, clock, "send", "the test needs the DB fixture: run with -p db")
    _, effects = command(core, clock, "resume")
    ask = only(effects, AskModel)  # the agent is asked again, not paused at once
    assert core.view.state == S.RUNNING
    for _ in range(3):
        ask = step(core, ask, clock, command="pytest -x -p db")
        assert ask is not None
    assert step(core, ask, clock, command="pytest -x -p db") is None  # a new loop
    assert len(stuck_changes(core)) == 2


def test_a_restored_core_keeps_the_window_and_pauses_once_for_one_loop():
    core, clock, ask = running()
    for _ in range(3):
        ask = step(core, ask, clock, command="pytest -x")
    log = _log_of(core)  # the Controller dies here; a new one folds the log
    fresh, _ = make()
    fresh.restore(log)
    effects = fresh.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True),
                           clock.tick())
    ask = only(effects, AskModel)
    assert step(fresh, ask, clock, command="pytest -x") is None  # the 4th, across restarts
    paused = _log_of(fresh)
    assert [e.cause for e in paused if isinstance(e, StateChanged)][-1] == Why.STUCK
    again, _ = make()  # restored once more, from the log that holds the pause
    again.restore(log + paused)
    effects = again.handle(RuntimeReady(session_id="s-1", epoch=3, attached=True),
                           clock.tick())
    assert again.view.state == S.PAUSED
    assert not [e for e in appended(effects) if isinstance(e, StateChanged)]


def test_a_crash_between_the_outcome_and_the_pause_pauses_on_restore():
    core, clock, ask = running()
    for _ in range(3):
        ask = step(core, ask, clock, command="pytest -x")
    run = only(answer(core, ask, clock, call("run", command="pytest -x")), RunAction)
    outcome = ObservationEvent(action_id=run.request.action_id,
                               outcome=Outcome(status="ok", content="same"))
    log = _log_of(core) + [outcome.model_copy(update={"seq": core.view.last_seq + 1})]
    fresh, _ = make()  # the outcome was recorded, the verdict not yet
    fresh.restore(log)
    effects = fresh.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True),
                           clock.tick())
    assert not [e for e in effects if isinstance(e, AskModel)]
    assert fresh.view.state == S.PAUSED
    assert len([e for e in appended(effects) if isinstance(e, StateChanged)
                and e.cause == Why.STUCK]) == 1


def test_detection_off_never_pauses():
    core, clock, ask = running(stuck=False)
    for _ in range(8):
        ask = step(core, ask, clock, command="pytest -x")
        assert ask is not None
    assert core.view.state == S.RUNNING


def test_thresholds_are_the_sessions_own():
    core, clock, ask = running(stuck={"repeat": 2})
    ask = step(core, ask, clock, command="ls")
    assert step(core, ask, clock, command="ls") is None
    assert "2 times" in stuck_changes(core)[0].reason
    assert [type(e) for e in _log_of(core)].count(MessageEvent) == 1  # the task only
