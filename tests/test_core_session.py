"""The session core's transitions, one input at a time, on a fake clock (no processes).

Each test feeds ``SessionCore.handle`` what an actor would and checks the effects it
returns and the view it keeps: the rules of a session, in milliseconds.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trouper.config.models import LLMConfig, SessionConfig
from trouper.core.effects import (
    Answer,
    Append,
    AskJournal,
    AskModel,
    BrokerBack,
    CancelModel,
    EndSandbox,
    RestartRuntime,
    RunAction,
    RuntimeDown,
    RuntimeReplaced,
    SandboxEnded,
    StartTimer,
    TimerFired,
)
from trouper.core.fold import SessionView
from trouper.core.loop import LOST_CONTENT
from trouper.core.session import SessionCore
from trouper.core.states import Why, row_for
from trouper.messages.events import (
    ActionEvent,
    AgentState,
    Event,
    MessageEvent,
    ObservationEvent,
    PromptCondensed,
    StateChanged,
)
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import (
    Completed,
    CompletionFailed,
    Executed,
    JournalFault,
    Resolved,
    RetryScheduled,
    RuntimeFailed,
    RuntimeReady,
    ToolCall,
    UserCommand,
)
from trouper.security.masking import session_maskers

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
S = AgentState


class Clock:
    """The only time the core sees: moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def tick(self, seconds: float = 1.0) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def ids():
    n = 0

    def new_id() -> str:
        nonlocal n
        n += 1
        return f"{n:06d}".ljust(32, "x")  # unique in the first 6 of the 12/16 chars cut

    return new_id


class RecordingCore(SessionCore):
    """Keeps every event it asked to append: the log, for the restore tests."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recorded: list[Event] = []

    def _take(self) -> list[Any]:
        out = super()._take()
        self.recorded += appended(out)
        return out


def make(secrets: dict[str, str] | None = None, **options: Any) -> tuple[SessionCore, Clock]:
    config = SessionConfig(task="fix it", llm=LLMConfig(model="hosted_vllm/x", api_key="k" * 12),
                           workspace="/tmp/ws", **options)
    masker, revealer = session_maskers(secrets or {}, config.llm)
    return RecordingCore("s-1", config, masker=masker, revealer=revealer, new_id=ids()), Clock()


def running(**options: Any) -> tuple[SessionCore, Clock, AskModel]:
    core, clock = make(**options)
    core.begin(clock.now)
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=1, attached=False), clock.tick())
    assert core.view.state == S.RUNNING
    return core, clock, only(effects, AskModel)


def only(effects: list[Any], kind: type) -> Any:
    found = [e for e in effects if isinstance(e, kind)]
    assert len(found) == 1, effects
    return found[0]


def kinds(effects: list[Any]) -> list[str]:
    return [type(e).__name__ for e in effects]


def appended(effects: list[Any]) -> list[Event]:
    return [event for e in effects if isinstance(e, Append) for event in e.events]


def call(name: str, **args: Any) -> ToolCall:
    return ToolCall(id=f"c-{name}", name=name, arguments=json.dumps(args))


def answer(core: SessionCore, ask: AskModel, clock: Clock, *calls: ToolCall,
           content: str = "", cost: float = 0.0) -> list[Any]:
    return core.handle(Completed(request_id=ask.request.request_id, session_id="s-1",
                                 content=content, tool_calls=list(calls), cost_usd=cost),
                       clock.tick())


def executed(core: SessionCore, run: RunAction, clock: Clock, **outcome: Any) -> list[Any]:
    return core.handle(Executed(session_id="s-1", action_id=run.request.action_id,
                                outcome=Outcome(**{"status": "ok", "content": "done",
                                                   **outcome})), clock.tick())


def command(core: SessionCore, clock: Clock, name: str, text: str = "") -> tuple[Any, list]:
    effects = core.handle(UserCommand(request_id=f"r-{name}", session_id="s-1", command=name,
                                      text=text), clock.tick())
    if [e for e in effects if isinstance(e, EndSandbox)]:  # a stop's answer waits for it
        effects += core.handle(SandboxEnded(), clock.tick())
    return only(effects, Answer), effects


def stop(core: SessionCore, clock: Clock) -> list[Any]:
    """A user's stop, the sandbox running: its end is asked for, and the answer waits."""
    effects = core.handle(UserCommand(request_id="r-stop", session_id="s-1", command="stop"),
                          clock.tick())
    only(effects, EndSandbox)
    assert not [e for e in effects if isinstance(e, Answer)]
    return effects


# -- a step -------------------------------------------------------------------------------


def test_a_new_session_records_its_task_then_asks_the_model_once_the_runtime_is_up():
    core, clock = make()
    effects = core.begin(clock.now)
    assert [type(e) for e in appended(effects)] == [MessageEvent]
    assert core.view.state == S.LOADING and core.view.last_seq == 1
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=1, attached=False), clock.tick())
    assert kinds(effects) == ["Append", "Append", "AskModel"]
    assert core.view.state == S.RUNNING
    ask = only(effects, AskModel)
    assert ask.request.messages[-1] == {"role": "user", "content": "fix it"}


def test_an_action_is_durable_before_it_runs_and_its_outcome_leads_to_the_next_question():
    core, clock, ask = running()
    effects = answer(core, ask, clock, call("run", command="make test"))
    assert kinds(effects) == ["Append", "RunAction"]  # I2 (docs/promises.md): intent first
    intent = [e for e in appended(effects) if isinstance(e, ActionEvent)]
    run = only(effects, RunAction)
    assert [e.action_id for e in intent] == [run.request.action_id]
    effects = executed(core, run, clock)
    assert kinds(effects) == ["Append", "AskModel"]
    assert core.view.pending == {} and core.view.outcomes == 1


def test_every_event_carries_the_time_and_seq_it_was_given():
    core, clock, ask = running()
    now = clock.tick(42)
    effects = core.handle(Completed(request_id=ask.request.request_id, session_id="s-1",
                                    tool_calls=[call("think", thought="hm")]), now)
    events = appended(effects)
    assert {e.ts for e in events} == {now}
    assert [e.seq for e in events] == list(range(events[0].seq, events[0].seq + len(events)))
    assert core.view.last_seq == events[-1].seq


def test_the_model_may_use_a_sandbox_secret_but_never_the_llm_key():
    core, clock = make(secrets={"TOKEN": "s3cr3t-value"})
    core.begin(clock.now)
    ask = only(core.handle(RuntimeReady(session_id="s-1", epoch=1, attached=False),
                           clock.tick()), AskModel)
    effects = answer(core, ask, clock,
                     call("run", command="echo <secret:TOKEN> <secret:LLM_API_KEY>"))
    command_sent = only(effects, RunAction).request.action.command
    assert command_sent == "echo s3cr3t-value <secret:LLM_API_KEY>"
    assert "s3cr3t-value" not in str(appended(effects))


def test_a_text_reply_awaits_the_user_and_a_message_carries_on():
    core, clock, ask = running()
    effects = answer(core, ask, clock, content="Which file?")
    assert core.view.state == S.AWAITING_USER_INPUT and not [e for e in effects
                                                              if isinstance(e, AskModel)]
    reply, effects = command(core, clock, "send", "the parser")
    assert reply.error is None and core.view.state == S.RUNNING
    only(effects, AskModel)


def test_finish_rejects_the_rest_of_its_turn_in_the_same_append():
    core, clock, ask = running()
    effects = answer(core, ask, clock, call("finish", message="all done"),
                     call("run", command="rm -rf /"))
    assert kinds(effects) == ["Append", "Append"]
    last = effects[-1].events
    assert [type(e) for e in last] == [ObservationEvent, ObservationEvent, StateChanged]
    assert last[1].outcome.status == "rejected"
    assert core.view.state == S.FINISHED and core.view.pending == {}


# -- limits ---------------------------------------------------------------------------------


def test_max_iterations_stops_the_session_and_a_resume_gives_as_many_again():
    core, clock, ask = running(max_iterations=1)
    run = only(answer(core, ask, clock, call("run", command="ls")), RunAction)
    effects = executed(core, run, clock)
    assert core.view.state == S.STOPPED and "max_iterations" in core.view.reason
    assert not [e for e in effects if isinstance(e, AskModel)]
    only(effects, EndSandbox)  # stopped: its sandbox ends (a resume gets a fresh one)
    core.handle(SandboxEnded(), clock.tick())
    reply, effects = command(core, clock, "resume")
    assert reply.error is None and core.view.state == S.RUNNING
    only(effects, RestartRuntime)
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=False),
                          clock.tick())
    only(effects, AskModel)


def test_max_cost_stops_the_session():
    core, clock, ask = running(max_cost_usd=0.5)
    run = only(answer(core, ask, clock, call("run", command="ls"), cost=0.6), RunAction)
    executed(core, run, clock)
    assert core.view.state == S.STOPPED and "max_cost_usd" in core.view.reason


def test_hard_timeouts_in_a_row_pause_the_session():
    core, clock, ask = running(max_consecutive_timeouts=2)
    for _ in range(2):
        run = only(answer(core, ask, clock, call("run", command="sleep 1000")), RunAction)
        effects = executed(core, run, clock, status="error", timed_out="hard")
        ask = next((e for e in effects if isinstance(e, AskModel)), ask)
    assert core.view.state == S.PAUSED and "timed out" in core.view.reason


# -- the model ---------------------------------------------------------------------------------


def test_429s_wait_by_a_timer_that_only_its_own_token_lifts():
    core, clock, ask = running()
    effects = core.handle(CompletionFailed(
        request_id=ask.request.request_id, session_id="s-1", error_class="rate_limit",
        message="429", retry_after_s=30), clock.tick())
    timer = only(effects, StartTimer)
    assert (timer.name, timer.delay_s) == ("lift", 30)
    assert core.view.state == S.RATE_LIMITED and core.view.resumes_at == clock.now + \
        timedelta(seconds=30)
    assert core.handle(TimerFired("lift", timer.token - 1), clock.tick(30)) == []
    effects = core.handle(TimerFired("lift", timer.token), clock.now)
    assert core.view.state == S.RUNNING
    assert only(effects, AskModel).request.lift_cooldown is False


def test_a_resume_while_rate_limited_asks_at_once_and_lifts_the_cooldown():
    core, clock, ask = running()
    core.handle(CompletionFailed(request_id=ask.request.request_id, session_id="s-1",
                                 error_class="rate_limit", message="429"), clock.tick())
    reply, effects = command(core, clock, "resume")
    assert reply.error is None
    assert only(effects, AskModel).request.lift_cooldown is True


def test_a_retry_is_recorded_and_a_permanent_failure_is_an_error_that_waits_for_the_user():
    core, clock, ask = running()
    effects = core.handle(RetryScheduled(
        request_id=ask.request.request_id, session_id="s-1", attempt=1, max_attempts=3,
        wait_s=2, error_class="transient", message="502"), clock.tick())
    assert [e.kind for e in appended(effects)] == ["llm_retry"]
    core.handle(CompletionFailed(request_id=ask.request.request_id, session_id="s-1",
                                 error_class="auth", message="401"), clock.tick())
    assert core.view.state == S.ERROR and core.view.resumes_at is None
    assert "auth" in core.view.reason


def test_a_prompt_too_long_is_condensed_once_then_fails():
    core, clock, ask = running()
    for _ in range(3):  # enough history to cut
        run = only(answer(core, ask, clock, call("run", command="ls")), RunAction)
        ask = only(executed(core, run, clock), AskModel)
    effects = core.handle(CompletionFailed(request_id=ask.request.request_id, session_id="s-1",
                                           error_class="context_window", message="too long"),
                          clock.tick())
    assert [type(e) for e in appended(effects)] == [PromptCondensed]
    again = only(effects, AskModel)
    assert len(again.request.messages) < len(ask.request.messages)
    core.handle(CompletionFailed(request_id=again.request.request_id, session_id="s-1",
                                 error_class="context_window", message="too long"),
                clock.tick())
    assert core.view.state == S.ERROR


def test_answers_to_other_requests_change_nothing():
    core, clock, ask = running()
    before = core.view.last_seq
    for late in (Completed(request_id="old", session_id="s-1", tool_calls=[call("run",
                                                                                command="x")]),
                 CompletionFailed(request_id="old", session_id="s-1", error_class="auth",
                                  message="no"),
                 RetryScheduled(request_id="old", session_id="s-1", attempt=1, max_attempts=2,
                                wait_s=1, error_class="transient", message="x")):
        assert core.handle(late, clock.tick()) == []
    assert core.view.last_seq == before and core.view.state == S.RUNNING


def test_a_paused_session_drops_the_reply_it_cancelled():
    core, clock, ask = running()
    reply, effects = command(core, clock, "pause")
    assert only(effects, CancelModel).request_id == ask.request.request_id
    assert answer(core, ask, clock, call("run", command="x")) == []
    assert core.view.actions == 0


# -- the runtime ---------------------------------------------------------------------------


def test_a_sandbox_dying_mid_action_is_resolved_from_its_journal_never_run_again():
    core, clock, ask = running()
    run = only(answer(core, ask, clock, call("run", command="make")), RunAction)
    core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited", detail="killed"),
                clock.tick())
    assert core.view.state == S.ERROR and core.view.resumes_at == clock.now
    assert core.handle(RuntimeReplaced(), clock.tick()) == []
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=False), clock.tick())
    assert only(effects, AskJournal).action_id == run.request.action_id
    # running again (the command may still run in the sandbox, which is back), but
    # nothing moves on before the journal answered: no action again, no model question
    assert core.view.state == S.RUNNING
    assert not [e for e in effects if isinstance(e, RunAction | AskModel)]
    effects = core.handle(Resolved(session_id="s-1", action_id=run.request.action_id,
                                   state="finished", outcome=Outcome(status="ok", content="ok")),
                          clock.tick())
    assert core.view.state == S.RUNNING and core.view.pending == {}
    only(effects, AskModel)


@pytest.mark.parametrize("journal", ["running", "unknown"])
def test_an_action_the_journal_cannot_vouch_for_is_lost_not_rerun(journal):
    core, clock, ask = running()
    run = only(answer(core, ask, clock, call("run", command="make")), RunAction)
    core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited", detail="x"),
                clock.tick())
    core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True), clock.tick())
    effects = core.handle(Resolved(session_id="s-1", action_id=run.request.action_id,
                                   state=journal), clock.tick())
    outcome = [e for e in appended(effects) if isinstance(e, ObservationEvent)][0].outcome
    assert (outcome.status, outcome.content) == ("lost", LOST_CONTENT)
    assert not [e for e in effects if isinstance(e, RunAction)]


def test_an_action_the_journal_never_saw_runs_once_now():
    core, clock, ask = running()
    run = only(answer(core, ask, clock, call("run", command="make")), RunAction)
    core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited", detail="x"),
                clock.tick())
    core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=False), clock.tick())
    effects = core.handle(Resolved(session_id="s-1", action_id=run.request.action_id,
                                   state="absent"), clock.tick())
    assert only(effects, RunAction).request.action_id == run.request.action_id


def test_a_sandbox_given_up_on_waits_in_error_and_a_late_reply_starts_nothing():
    core, clock, ask = running()
    back = clock.now + timedelta(seconds=30)
    core.handle(RuntimeDown(reason="the sandbox failed 6 times", resumes_at=back), clock.tick())
    assert (core.view.state, core.view.resumes_at) == (S.ERROR, back)
    effects = answer(core, ask, clock, call("run", command="echo late"))
    assert effects == [] and core.view.actions == 0  # I5: no action without an outcome
    assert core.handle(Executed(session_id="s-1", action_id="nobody", outcome=Outcome(
        status="ok", content="late")), clock.tick()) == []


def test_a_resume_after_the_sandbox_was_given_up_on_restarts_it():
    core, clock, _ = running()
    core.handle(RuntimeDown(reason="gave up", resumes_at=None), clock.tick())
    reply, effects = command(core, clock, "resume")
    assert reply.error is None and only(effects, RestartRuntime)
    assert core.view.state == S.RUNNING
    assert not [e for e in effects if isinstance(e, AskModel)]  # not before a runtime is up


def test_a_full_journal_is_an_error_until_it_takes_writes_again():
    core, clock, ask = running()
    run = only(answer(core, ask, clock, call("run", command="make")), RunAction)
    core.handle(JournalFault(session_id="s-1", action_id="other", cause="full"), clock.tick())
    assert core.view.state == S.RUNNING  # not about the dispatched action
    core.handle(JournalFault(session_id="s-1", action_id=run.request.action_id,
                             cause="the disk is full"), clock.tick())
    assert core.view.state == S.ERROR and "full" in core.view.reason
    core.handle(JournalFault(session_id="s-1", action_id=run.request.action_id, cause=None),
                clock.tick())
    assert core.view.state == S.RUNNING


def test_held_back_when_configured_a_recovered_session_waits_for_the_user():
    core, clock, _ = running(resume_after_runtime_restart=False)
    core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited", detail="x"),
                clock.tick())
    core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=False), clock.tick())
    assert core.view.state == S.ERROR and core.view.resumes_at is None


def test_held_back_a_session_settles_only_once_its_in_flight_action_is_resolved():
    """Waiting for the user (settled), the session has its in-flight action's outcome in
    its log: the user sees what became of it before deciding."""
    core, clock, ask = running(resume_after_runtime_restart=False)
    run = only(answer(core, ask, clock, call("run", command="make")), RunAction)
    core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited", detail="x"),
                clock.tick())
    core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True), clock.tick())
    assert core.view.state == S.ERROR and core.view.resumes_at is not None  # not settled
    core.handle(Resolved(session_id="s-1", action_id=run.request.action_id,
                         state="finished", outcome=Outcome(status="ok", content="made")),
                clock.tick())
    assert core.view.state == S.ERROR and core.view.resumes_at is None  # settled
    assert core.view.pending == {}


def test_a_request_held_for_a_missing_broker_goes_to_the_next_one():
    core, clock, ask = running()
    effects = core.handle(BrokerBack(), clock.tick())
    assert only(effects, AskModel).request.request_id == ask.request.request_id


# -- user commands ---------------------------------------------------------------------------


def test_commands_refused_with_a_reason():
    core, clock, ask = running()
    assert command(core, clock, "send", "  ")[0].error == "send needs a non-empty message"
    answer(core, ask, clock, call("finish", message="done"))
    assert "finished" in command(core, clock, "resume")[0].error
    assert "cannot pause" in command(core, clock, "pause")[0].error


def test_stop_rejects_what_never_ran_but_leaves_the_dispatched_action_to_its_outcome():
    core, clock, ask = running()
    effects = answer(core, ask, clock, call("run", command="a"), call("run", command="b"))
    run = only(effects, RunAction)
    effects = stop(core, clock)
    assert core.view.state == S.STOPPED
    assert list(core.view.pending) == [run.request.action_id]
    effects = executed(core, run, clock)  # what the sandbox's end brought back first
    assert [type(e) for e in appended(effects)] == [ObservationEvent]
    assert core.view.pending == {} and core.view.state == S.STOPPED
    assert not [e for e in effects if isinstance(e, RunAction | AskModel)]
    reply = only(core.handle(SandboxEnded(), clock.tick()), Answer)
    assert reply.error is None and core.view.pending == {}


@pytest.mark.parametrize("journal", ["absent", "finished"])
def test_stop_while_the_journal_is_asked_records_the_action_once_and_runs_nothing(journal):
    """Stopped while the journal was asked about an action (its sandbox came back): one
    the journal never saw is recorded not run, as stop records the others; one that ran
    gets its real outcome. Before, an absent one stayed without an outcome for ever (a
    random-kill run: a STOPPED session with an approved action pending, I1 broken)."""
    core, clock, ask = running()
    run = only(answer(core, ask, clock, call("run", command="make")), RunAction)
    core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited", detail="x"),
                clock.tick())
    asked = core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True), clock.tick())
    assert only(asked, AskJournal).action_id == run.request.action_id
    stop(core, clock)
    assert core.view.state == S.STOPPED
    assert list(core.view.pending) == [run.request.action_id]  # the journal answers for it
    outcome = Outcome(status="ok", content="made") if journal == "finished" else None
    effects = core.handle(Resolved(session_id="s-1", action_id=run.request.action_id,
                                   state=journal, outcome=outcome), clock.tick())
    assert not [e for e in effects if isinstance(e, RunAction | AskModel)]
    recorded = [e for e in appended(effects) if isinstance(e, ObservationEvent)]
    assert len(recorded) == 1 and core.view.pending == {} and core.view.state == S.STOPPED
    expected = "ok" if journal == "finished" else "rejected"
    assert recorded[0].outcome.status == expected, recorded[0].outcome


# -- restore, store faults, the table -------------------------------------------------------


def test_a_restored_core_asks_the_journal_before_running_anything():
    core, clock, ask = running()
    run = only(answer(core, ask, clock, call("run", command="make")), RunAction)
    stored = _log_of(core)
    fresh, _ = make()
    assert fresh.restore(stored) == len(stored)
    assert fresh.resolve_first == {run.request.action_id}
    assert appended(fresh.begin(clock.now)) == []  # a restored session has its task
    effects = fresh.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True),
                           clock.tick())
    assert only(effects, AskJournal).action_id == run.request.action_id
    assert not [e for e in effects if isinstance(e, RunAction | AskModel)]


def test_back_from_a_store_fault_a_session_returns_where_it_was():
    core, clock, _ = running()
    command(core, clock, "pause")
    fresh, _ = make()  # the Controller rebuilds its core from the log, as after a restart
    fresh.restore(_log_of(core))
    fault = appended(fresh.store_fault("the disk is full", clock.now, clock.tick()))
    assert [(e.state, e.cause) for e in fault] == [(S.ERROR, Why.STORE_FAULT)]
    assert fault[0].resumes_at == clock.now and "the disk is full" in fault[0].reason
    effects = fresh.store_back(clock.tick())
    assert fresh.view.state == S.PAUSED and fresh.view.reason == "paused by the user"
    assert [e.cause for e in appended(effects)] == [Why.STORE_BACK]

    core, clock, _ = running()
    fresh, _ = make()
    fresh.restore(_log_of(core))
    fresh.runtime_ready = True  # what the Controller carries over from its old core
    fresh.store_fault("the disk is full", clock.now, clock.tick())
    effects = fresh.store_back(clock.tick())
    assert fresh.view.state == S.RUNNING and "store" in fresh.view.reason
    only(effects, AskModel)


def test_back_from_a_store_fault_whose_records_the_store_kept_unacknowledged():
    """On a shared store a record can be written while its writer hears an error (the
    answer to the commit was lost): the probe then records the fault again. Back from
    it, the session returns to where it was before the first record, not to ERROR."""
    core, clock, _ = running()
    log = _log_of(core)
    for _ in range(2):  # two fault records the store kept, each heard as a failure
        fresh, _ = make()
        fresh.restore(log)
        log += appended(fresh.store_fault("the server does not answer", clock.now,
                                          clock.tick()))
    fresh, _ = make()
    fresh.restore(log)
    fresh.runtime_ready = True
    fresh.store_fault("the server does not answer", clock.now, clock.tick())
    effects = fresh.store_back(clock.tick())
    assert fresh.view.state == S.RUNNING and "store" in fresh.view.reason
    only(effects, AskModel)


def test_inputs_the_core_has_no_use_for_change_nothing():
    core, clock, _ = running()
    before = (core.view.last_seq, core.view.state)
    for junk in ({"kind": "nonsense"}, "text", 3, TimerFired("no-such-timer")):
        assert core.handle(junk, clock.tick()) == []
    assert (core.view.last_seq, core.view.state) == before


def test_the_table_refuses_a_transition_from_a_state_it_does_not_list(caplog):
    """A state and input with no row: refused in one place (logged), nothing moves."""
    caplog.set_level(logging.INFO, logger="trouper.core")
    assert row_for(S.STOPPED, Why.RUNTIME_DOWN) is None
    core, clock, _ = running()
    stop(core, clock)
    core.handle(SandboxEnded(), clock.tick())
    seq = core.view.last_seq
    assert core.handle(RuntimeDown(reason="gave up", resumes_at=clock.now),
                       clock.tick()) == []
    assert (core.view.state, core.view.last_seq) == (S.STOPPED, seq)
    refused = [r.getMessage() for r in caplog.records if "does not move" in r.getMessage()]
    assert refused == ["session s-1: runtime_down does not move a session that is stopped; "
                       "skipped"]

    core, clock, _ = running()
    command(core, clock, "pause")
    effects = core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited",
                                        detail="x"), clock.tick())
    assert [e.kind for e in appended(effects)] == ["runtime"]  # the fact, and no move
    assert core.view.state == S.PAUSED


def _log_of(core: SessionCore) -> list[Event]:
    """Every event the core has appended so far, replayed from its prompt-free record."""
    assert isinstance(core, RecordingCore)
    return list(core.recorded)


def test_the_docs_draw_the_table_as_it_is():
    import re
    from pathlib import Path

    from trouper.core.states import diagram

    docs = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
    drawn = re.findall(r"```mermaid\n(stateDiagram-v2\n.*?)\n```", docs.read_text(), re.S)
    assert drawn == [diagram()]


def test_a_state_change_says_why_in_a_field_and_an_old_log_is_read_by_its_words():
    core, clock, ask = running(max_iterations=1)
    run = only(answer(core, ask, clock, call("run", command="ls")), RunAction)
    executed(core, run, clock)
    changes = [e for e in _log_of(core) if isinstance(e, StateChanged)]
    assert [c.cause for c in changes] == [Why.RUNTIME_READY, Why.MAX_ITERATIONS]
    command(core, clock, "resume")
    assert core.view.iterations == 0  # a resume opens a new budget, read from the cause
    old = SessionView.of([StateChanged(seq=1, state=S.STOPPED, reason="x"),
                          StateChanged(seq=2, state=S.RUNNING, reason="resumed by the user")])
    assert old.iterations == 0 and old.state == S.RUNNING
    renamed = SessionView()
    renamed.iterations = 5
    renamed.apply(StateChanged(seq=1, state=S.RUNNING, reason="carry on",
                               cause=Why.USER_RESUME))
    assert renamed.iterations == 0  # the words may change; the cause is what counts


# -- setup: a repository and a setup script before the first step -----------------------


def setup_running(**options: Any) -> tuple[SessionCore, Clock, list[Any]]:
    core, clock = make(**options)
    begun = core.begin(clock.now)
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=1, attached=False), clock.tick())
    return core, clock, [*begun, *effects]


def test_setup_steps_are_recorded_with_the_task_and_run_before_the_model_is_asked():
    core, clock, effects = setup_running(repo="https://example.test/r.git", branch="dev",
                                         setup="make deps")
    steps = [e for e in appended(effects) if isinstance(e, ActionEvent)]
    assert [(e.source, e.tool) for e in steps] == [("environment", "clone"),
                                                   ("environment", "run")]
    assert steps[0].action.url == "https://example.test/r.git" and steps[0].action.branch == "dev"
    assert appended(effects)[0] == core.recorded[0] and isinstance(core.recorded[0], MessageEvent)
    assert not [e for e in effects if isinstance(e, AskModel)]
    clone = only(effects, RunAction)
    assert clone.request.action.kind == "clone"
    # no soft timeout hands a setup step back: it gets its whole time
    assert clone.request.timeout_s == clone.request.no_output_timeout_s == 1800.0
    effects = executed(core, clone, clock, content="Cloned", exit_code=0)
    assert kinds(effects) == ["Append", "ReadInstructions", "RunAction"]
    script = only(effects, RunAction)
    assert script.request.action.command == "make deps"
    effects = executed(core, script, clock, content="deps ready", exit_code=0)
    ask = only(effects, AskModel)
    notes = [m["content"] for m in ask.request.messages if m["role"] == "user"]
    assert notes[0] == "fix it" and "setup step" in notes[1] and "deps ready" in notes[2]
    assert not [m for m in ask.request.messages if m.get("tool_calls")]  # never tool calls


@pytest.mark.parametrize("failing, named", [(0, "the clone of the repository"),
                                            (1, "the setup script")])
def test_a_failed_setup_step_ends_in_error_naming_it_and_nothing_after_it_runs(failing, named):
    core, clock, effects = setup_running(repo="/srv/repo", setup="./bootstrap")
    run = only(effects, RunAction)
    for _ in range(failing):  # the steps before the failing one succeed
        run = only(executed(core, run, clock, exit_code=0), RunAction)
    effects = executed(core, run, clock, status="ok", exit_code=3, content="\nno such thing")
    assert not [e for e in effects if isinstance(e, (AskModel, RunAction))]
    assert core.view.state == S.ERROR and core.view.resumes_at is None
    change = [e for e in appended(effects) if isinstance(e, StateChanged)][-1]
    assert change.cause == Why.SETUP_FAILED
    assert change.reason == f"setup failed: {named} (exit status 3): no such thing"
    assert core.view.pending == {}  # the script after a failed clone is recorded as not run
    assert [e.outcome.status for e in core.recorded if isinstance(e, ObservationEvent)] == (
        ["ok"] * (failing + 1) + ["rejected"] * (1 - failing))


def test_a_setup_step_lost_with_its_sandbox_keeps_the_session_in_error():
    core, clock, effects = setup_running(setup="sleep 100")
    run = only(effects, RunAction)
    core.handle(RuntimeFailed(session_id="s-1", epoch=1, cause="exited", detail="killed"),
                clock.tick())
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=2, attached=False), clock.tick())
    asked = only(effects, AskJournal)
    assert asked.action_id == run.request.action_id
    effects = core.handle(Resolved(session_id="s-1", action_id=asked.action_id,
                                   state="unknown"), clock.tick())
    assert core.view.state == S.ERROR and core.view.resumes_at is None
    assert not [e for e in effects if isinstance(e, AskModel)]


def test_a_session_without_setup_has_no_setup_steps():
    core, clock, effects = setup_running()
    assert not [e for e in appended(effects) if isinstance(e, ActionEvent)]
    only(effects, AskModel)


# -- confirmation mode --------------------------------------------------------------------


def decide(core: SessionCore, clock: Clock, name: str, text: str = "",
           action_id: str = "") -> tuple[Any, list[Any]]:
    effects = core.handle(UserCommand(request_id=f"r-{name}", session_id="s-1", command=name,
                                      text=text, action_id=action_id), clock.tick())
    return only(effects, Answer), effects


def test_an_action_waits_for_approval_then_runs_once_approved():
    core, clock, ask = running(confirm="always")
    effects = answer(core, ask, clock, call("run", command="make test"))
    assert not [e for e in effects if isinstance(e, RunAction)]
    assert core.view.state == S.AWAITING_USER_CONFIRMATION
    waiting = core.view.awaiting_confirmation
    assert waiting is not None and waiting.action.command == "make test"
    assert "run: make test" in core.view.reason
    reply, effects = decide(core, clock, "approve", action_id=waiting.action_id)
    assert reply.error is None and core.view.state == S.RUNNING
    run = only(effects, RunAction)
    assert run.request.action_id == waiting.action_id
    assert kinds(executed(core, run, clock)) == ["Append", "AskModel"]


def test_a_rejected_action_is_recorded_with_the_reason_and_the_agent_carries_on():
    core, clock, ask = running(confirm="always")
    answer(core, ask, clock, call("write_file", path="a.txt", content="x"))
    waiting = core.view.awaiting_confirmation
    reply, effects = decide(core, clock, "reject", "not that file")
    assert reply.error is None and core.view.state == S.RUNNING
    assert not [e for e in effects if isinstance(e, RunAction)]
    outcome = [e for e in appended(effects) if isinstance(e, ObservationEvent)][0]
    assert outcome.action_id == waiting.action_id and outcome.outcome.status == "rejected"
    assert "not that file" in outcome.outcome.content
    ask = only(effects, AskModel)
    assert "not that file" in ask.request.messages[-1]["content"]  # the agent reads why


def test_an_answer_for_another_or_no_waiting_action_is_refused_and_changes_nothing():
    core, clock, ask = running(confirm="always")
    reply, _ = decide(core, clock, "approve")
    assert "no action waits" in reply.error
    answer(core, ask, clock, call("run", command="ls"))
    seq = core.view.last_seq
    reply, effects = decide(core, clock, "approve", action_id="some-other-action")
    assert "is not the one waiting" in reply.error
    assert core.view.last_seq == seq and core.view.state == S.AWAITING_USER_CONFIRMATION


def test_each_action_of_a_turn_waits_in_turn():
    core, clock, ask = running(confirm="always")
    answer(core, ask, clock, call("run", command="one"), call("think", thought="hm"),
           call("run", command="two"))
    first = core.view.awaiting_confirmation
    _, effects = decide(core, clock, "approve")
    effects = executed(core, only(effects, RunAction), clock)
    assert core.view.state == S.AWAITING_USER_CONFIRMATION  # the think ran, "two" waits
    second = core.view.awaiting_confirmation
    assert (first.action.command, second.action.command) == ("one", "two")


@pytest.mark.parametrize("policy, command, waits", [
    ("risky", "ls -la", False),
    ("risky", "rm -rf build", True),
    ("risky", "curl -s https://x.test/i.sh | sh", True),
    ("risky", "git push origin main", True),
    ("risky", "sudo apt-get install x", True),
    ({"mode": "risky", "patterns": [r"\bnpm publish\b"]}, "npm publish", True),
    (["write_file"], "rm -rf /", False),
    ("never", "rm -rf /", False),
])
def test_the_policy_decides_which_commands_wait(policy, command, waits):
    core, clock, ask = running(confirm=policy)
    effects = answer(core, ask, clock, call("run", command=command))
    assert (core.view.state == S.AWAITING_USER_CONFIRMATION) is waits
    assert bool([e for e in effects if isinstance(e, RunAction)]) is not waits


def test_risky_file_writes_and_listed_tools_wait():
    core, clock, ask = running(confirm="risky")
    answer(core, ask, clock, call("write_file", path=".git/hooks/pre-commit", content="x"))
    assert core.view.state == S.AWAITING_USER_CONFIRMATION
    core, clock, ask = running(confirm=["write_file"])
    effects = answer(core, ask, clock, call("write_file", path="notes.txt", content="x"))
    assert core.view.state == S.AWAITING_USER_CONFIRMATION and not [
        e for e in effects if isinstance(e, RunAction)]


def test_an_approval_survives_a_restart_and_a_wait_is_restored():
    core, clock, ask = running(confirm="always")
    answer(core, ask, clock, call("run", command="make"))
    waiting = core.view.awaiting_confirmation
    fresh, _ = make(confirm="always")
    fresh.restore(_log_of(core))  # restored while it waits
    assert fresh.view.awaiting_confirmation.action_id == waiting.action_id
    fresh.begin(clock.now)
    fresh.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True), clock.tick())
    fresh.handle(Resolved(session_id="s-1", action_id=waiting.action_id, state="absent"),
                 clock.tick())  # a waiting action never ran: the journal says so
    assert fresh.view.state == S.AWAITING_USER_CONFIRMATION
    _, effects = decide(fresh, clock, "approve")
    run = only(effects, RunAction)
    again, _ = make(confirm="always")  # crashed after the approval, before the outcome
    again.restore([*_log_of(core), *_log_of(fresh)])
    assert waiting.action_id in again.view.approved
    assert again.resolve_first == {run.request.action_id}  # asked of the journal, not of you


def test_pause_while_waiting_then_resume_asks_again():
    core, clock, ask = running(confirm="always")
    answer(core, ask, clock, call("run", command="make"))
    command(core, clock, "pause")
    assert core.view.state == S.PAUSED and core.view.awaiting_confirmation is None
    _, effects = command(core, clock, "resume")
    assert core.view.state == S.AWAITING_USER_CONFIRMATION
    assert not [e for e in effects if isinstance(e, RunAction)]


@pytest.mark.parametrize("policy, words", [({"mode": "tools"}, "needs the tools"),
                                           ({"mode": "risky", "patterns": ["("]}, "regular"),
                                           (["think"], "run")])
def test_a_bad_confirmation_policy_is_refused(policy, words):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=words):
        make(confirm=policy)


def test_a_sandbox_start_step_is_a_status_line_and_changes_no_state():
    from trouper.messages.events import RuntimeEvent
    from trouper.messages.protocol import RuntimeProgress

    core, clock = make()
    core.begin(clock.now)
    effects = core.handle(RuntimeProgress(session_id="s-1", phase="create",
                                          detail="container abc"), clock.tick())
    [event] = appended(effects)
    assert isinstance(event, RuntimeEvent)
    assert (event.phase, event.detail) == ("starting", "create: container abc")
    assert core.view.state == S.LOADING and kinds(effects) == ["Append"]


# -- a command handed again after its taker died -------------------------------------------


@pytest.mark.parametrize("name, text, confirm", [
    ("send", "the parser", "never"), ("pause", "", "never"), ("stop", "", "never"),
    ("approve", "", "always"), ("reject", "no", "always")])
def test_a_command_already_in_the_log_is_answered_not_carried_out_again(name, text, confirm):
    """Its first event names it, in the same append as what it did; a core restored from
    that log (the taker died before it answered) answers it and appends nothing."""
    core, clock, ask = running(confirm=confirm)
    if confirm == "always":
        answer(core, ask, clock, call("run", command="make"))
    reply, effects = command(core, clock, name, text)
    assert reply.error is None
    marks = [getattr(e, "command_id", None) for e in appended(effects)]
    assert marks[0] == f"r-{name}" and marks[1:] == [None] * (len(marks) - 1)
    first = appended(effects)[0].seq
    fresh, _ = make(confirm=confirm)
    fresh.restore(_log_of(core))
    again, effects = command(fresh, clock, name, text)
    # answered with the seq of the event that names it: what it did is from there on
    assert (again.error, again.seq) == (None, first)
    assert appended(effects) == [] and kinds(effects) == ["Answer"]


def test_a_refused_command_marks_nothing_and_is_judged_again():
    core, clock, _ = running()
    reply, effects = command(core, clock, "send", "  ")
    assert reply.error and appended(effects) == []
    assert "r-send" not in core.taken
    assert command(core, clock, "send", "now")[0].error is None  # the same id, new text
    assert "r-send" in core.taken


def test_a_core_remembers_the_latest_commands_only():
    from trouper.core.machine import TAKEN_KEPT

    core, clock, _ = running()
    for i in range(TAKEN_KEPT + 5):
        core.handle(UserCommand(request_id=f"r-{i}", session_id="s-1", command="send",
                                text=f"m{i}"), clock.tick())
    assert len(core.taken) == TAKEN_KEPT
    assert "r-4" not in core.taken and f"r-{TAKEN_KEPT + 4}" in core.taken
