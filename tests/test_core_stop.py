"""A stopped session's sandbox ends at once (``core/ending.py``), one input at a time on a
fake clock: what is in flight gets exactly one outcome, the stop's answer waits for the
end, and the session goes on in a fresh sandbox, the agent told so.

Before, a stop left the sandbox (its shell, its background jobs, its container) running
until the session stood down, ten minutes later.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # the core's helpers (pytest imports by path)
from test_core_session import (  # noqa: E402
    S,
    _log_of,
    answer,
    appended,
    call,
    command,
    executed,
    make,
    only,
    running,
    stop,
)

from trouper.core.effects import (  # noqa: E402
    Answer,
    AskJournal,
    AskModel,
    EndSandbox,
    RestartRuntime,
    RunAction,
    SandboxEnded,
    StartTimer,
    TimerFired,
)
from trouper.core.ending import SHELL_RESET, STOPPED_IN_FLIGHT  # noqa: E402
from trouper.messages.events import MessageEvent, ObservationEvent, RuntimeEvent  # noqa: E402
from trouper.messages.protocol import Resolved, RuntimeFailed, RuntimeReady  # noqa: E402


def outcomes(effects: list[Any]) -> list[ObservationEvent]:
    return [e for e in appended(effects) if isinstance(e, ObservationEvent)]


def a_running_command() -> tuple[Any, Any, RunAction]:
    core, clock, ask = running()
    run = only(answer(core, ask, clock, call("run", command="sleep 1000 & sleep 1000")),
               RunAction)
    return core, clock, run


def test_a_stop_ends_the_sandbox_after_its_record_and_answers_once_it_is_ended():
    core, clock, run = a_running_command()
    effects = stop(core, clock)
    names = [type(e).__name__ for e in effects]
    assert names.index("Append") < names.index("EndSandbox")  # the stop is durable first
    assert only(effects, StartTimer).name == "end_answer"
    # the end killed the command: the sandbox's journal says so, and that comes back first
    effects = executed(core, run, clock, status="interrupted", content="[Interrupted: ...]")
    assert [o.outcome.status for o in outcomes(effects)] == ["interrupted"]
    effects = core.handle(SandboxEnded(), clock.tick())
    assert only(effects, Answer).error is None
    assert outcomes(effects) == []  # one outcome (I1 in docs/promises.md)
    [closed] = appended(effects)
    assert isinstance(closed, RuntimeEvent) and closed.phase == "closed"
    assert core.view.pending == {} and core.view.state == S.STOPPED
    assert not [e for e in effects if isinstance(e, RunAction | AskModel | EndSandbox)]


def test_an_action_whose_result_never_came_back_is_recorded_interrupted_once():
    core, clock, run = a_running_command()
    stop(core, clock)
    effects = core.handle(SandboxEnded(), clock.tick())
    [recorded] = outcomes(effects)
    assert recorded.action_id == run.request.action_id
    assert (recorded.outcome.status, recorded.outcome.content) == ("interrupted",
                                                                   STOPPED_IN_FLIGHT)
    assert "stopped" in recorded.outcome.content and "not run again" in recorded.outcome.content
    assert outcomes(executed(core, run, clock)) == []  # a late result records nothing more
    assert core.view.pending == {}


def test_a_stop_while_the_sandbox_restarts_waits_for_its_journal_then_ends_it():
    core, clock, run = a_running_command()
    core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited", detail="x"),
                clock.tick())
    effects = core.handle(_stop_msg(), clock.tick())
    assert only(effects, Answer).error is None  # nothing to wait for: no sandbox runs
    assert not [e for e in effects if isinstance(e, EndSandbox)]  # its journal answers first
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True), clock.tick())
    assert only(effects, AskJournal).action_id == run.request.action_id
    only(effects, EndSandbox)  # the end answers for what still runs in it
    real = Resolved(session_id="s-1", action_id=run.request.action_id, state="finished",
                    outcome=_ok())
    assert [o.outcome.status for o in outcomes(core.handle(real, clock.tick()))] == ["ok"]
    assert outcomes(core.handle(SandboxEnded(), clock.tick())) == []


def test_an_action_its_journal_did_not_answer_for_before_the_end_is_lost_once():
    core, clock, run = a_running_command()
    core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited", detail="x"),
                clock.tick())
    core.handle(_stop_msg(), clock.tick())
    core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True), clock.tick())
    [lost] = outcomes(core.handle(SandboxEnded(), clock.tick()))
    assert (lost.outcome.status, lost.outcome.content) == ("lost", STOPPED_IN_FLIGHT)
    late = Resolved(session_id="s-1", action_id=run.request.action_id, state="finished",
                    outcome=_ok())
    assert outcomes(core.handle(late, clock.tick())) == []


def test_resume_after_a_stop_starts_a_fresh_sandbox_and_tells_the_agent():
    core, clock, run = a_running_command()
    stop(core, clock)
    core.handle(SandboxEnded(), clock.tick())
    reply, effects = command(core, clock, "resume")
    assert reply.error is None and core.view.state == S.RUNNING
    only(effects, RestartRuntime)
    [told] = [e for e in appended(effects) if isinstance(e, MessageEvent)]
    assert (told.source, told.text) == ("environment", SHELL_RESET)
    assert not [e for e in effects if isinstance(e, RunAction | AskModel)]  # none runs yet
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=3, attached=False), clock.tick())
    ask = only(effects, AskModel)
    assert SHELL_RESET in repr(ask.request.messages)  # in the agent's prompt
    assert not [e for e in effects if isinstance(e, RunAction)]  # nothing run again


def test_a_resume_before_the_end_is_done_starts_the_fresh_sandbox_after_it():
    core, clock, run = a_running_command()
    stop(core, clock)
    reply, effects = command(core, clock, "resume")  # the helper feeds no end for a resume
    assert reply.error is None and core.view.state == S.RUNNING
    assert not [e for e in effects if isinstance(e, RestartRuntime)]  # not while it ends
    effects = core.handle(SandboxEnded(), clock.tick())
    assert [a.request_id for a in effects if isinstance(a, Answer)] == ["r-stop"]
    only(effects, RestartRuntime)
    assert [o.outcome.status for o in outcomes(effects)] == ["interrupted"]


def test_a_send_after_a_stop_goes_on_in_a_fresh_sandbox():
    core, clock, _ = a_running_command()
    stop(core, clock)
    core.handle(SandboxEnded(), clock.tick())
    reply, effects = command(core, clock, "send", "carry on")
    assert reply.error is None and core.view.state == S.RUNNING
    only(effects, RestartRuntime)
    texts = [e.text for e in appended(effects) if isinstance(e, MessageEvent)]
    assert texts == ["carry on", SHELL_RESET]


def test_a_slow_end_answers_the_stop_after_the_wait_by_its_own_timer_only():
    core, clock, _ = a_running_command()
    timer = only(stop(core, clock), StartTimer)
    assert core.handle(TimerFired("end_answer", timer.token - 1), clock.tick()) == []
    effects = core.handle(TimerFired("end_answer", timer.token), clock.tick(timer.delay_s))
    assert only(effects, Answer).error is None
    assert [e for e in core.handle(SandboxEnded(), clock.tick()) if isinstance(e, Answer)] == []


def test_a_second_stop_while_it_ends_waits_for_the_same_end():
    core, clock, _ = a_running_command()
    stop(core, clock)
    effects = core.handle(_stop_msg("r-again"), clock.tick())
    assert not [e for e in effects if isinstance(e, Answer | EndSandbox | StartTimer)]
    answered = [e.request_id for e in core.handle(SandboxEnded(), clock.tick())
                if isinstance(e, Answer)]
    assert answered == ["r-stop", "r-again"]


def test_a_budget_stop_ends_the_sandbox_too_and_other_settled_states_keep_theirs():
    core, clock, ask = running(max_iterations=1)
    run = only(answer(core, ask, clock, call("run", command="ls")), RunAction)
    only(executed(core, run, clock), EndSandbox)
    for name in ("finished", "pause", "text"):
        core, clock, ask = running()
        if name == "finished":
            effects = answer(core, ask, clock, call("finish", message="done"))
        elif name == "pause":
            effects = command(core, clock, "pause")[1]
        else:
            effects = answer(core, ask, clock, content="a question?")
        assert core.view.state != S.STOPPED
        assert not [e for e in effects if isinstance(e, EndSandbox)], name


def test_a_core_restored_stopped_ends_what_is_left_before_any_sandbox_starts():
    core, clock, _ = a_running_command()
    stop(core, clock)
    core.handle(SandboxEnded(), clock.tick())
    fresh, _ = make()
    fresh.restore(_log_of(core))
    effects = fresh.begin(clock.tick())
    only(effects, EndSandbox)  # even though its log says ended: a program may have died
    effects = fresh.handle(SandboxEnded(), clock.tick())
    assert appended(effects) == []  # the log says it already


def test_a_core_restored_stopped_mid_action_asks_the_journal_before_it_ends_the_sandbox():
    core, clock, run = a_running_command()
    stop(core, clock)  # and the program died before the end came back
    fresh, _ = make()
    fresh.restore(_log_of(core))
    assert [e for e in fresh.begin(clock.tick()) if isinstance(e, EndSandbox)] == []
    effects = fresh.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True),
                           clock.tick())
    assert only(effects, AskJournal).action_id == run.request.action_id
    only(effects, EndSandbox)


def test_an_end_nobody_asked_for_changes_nothing():
    core, clock, _ = running()
    before = core.view.last_seq
    assert core.handle(SandboxEnded(), clock.tick()) == []
    assert core.view.last_seq == before and core.view.state == S.RUNNING


def _stop_msg(request_id: str = "r-stop") -> Any:
    from trouper.messages.protocol import UserCommand

    return UserCommand(request_id=request_id, session_id="s-1", command="stop")


def _ok() -> Any:
    from trouper.messages.outcomes import Outcome

    return Outcome(status="ok", content="made")
