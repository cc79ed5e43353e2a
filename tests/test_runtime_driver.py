"""The RuntimeProxy's rules (``runtimes/driver.py``), one input at a time, with a fake
sandbox backend and no process: what it reports, answers, holds, retries and drops."""

from __future__ import annotations

from typing import Any

from trouper.exceptions import (
    RuntimeMisconfigured,
    RuntimeUnavailable,
    StaleEpoch,
    StoreUnavailable,
)
from trouper.messages.protocol import (
    CloseSandbox,
    Executed,
    JournalFault,
    ResolveAction,
    Resolved,
    RuntimeFailed,
    RuntimeFailure,
    RuntimeReady,
    SandboxClosed,
)
from trouper.messages.tree import Superseded
from trouper.runtimes.base import JournalRecord, SandboxHealth
from trouper.runtimes.driver import After, Drop, Exit, Reply, RuntimeDriver, ToParent
from trouper.testing.fake_sandbox import (
    OK,
    SID,
    FakeSandbox,
    Held,
    execute,
    finish,
    run,
)


def ready() -> tuple[RuntimeDriver, FakeSandbox, list[Any]]:
    sandbox = FakeSandbox()
    driver = RuntimeDriver(SID, sandbox)  # type: ignore[arg-type]
    return driver, sandbox, run(driver.start())


def replies(effects: list[Any]) -> list[Any]:
    return [e.msg for e in effects if isinstance(e, Reply)]


def test_a_started_sandbox_is_reported_ready_with_its_epoch_and_health_is_timed():
    driver, _, effects = ready()
    assert [type(e) for e in effects] == [ToParent, After]
    assert effects[0].msg == RuntimeReady(session_id=SID, epoch=7, attached=False)
    assert effects[1].name == "health"


def test_an_action_runs_once_and_answers_whoever_asked():
    driver, sandbox, _ = ready()
    effects = run(driver.execute(execute(), "controller"))
    assert effects == [Reply("controller", Executed(session_id=SID, action_id="a1", outcome=OK))]
    assert sandbox.runtime.executed == ["a1"]


def test_requests_while_the_sandbox_starts_wait_for_it_then_run():
    sandbox = FakeSandbox()
    driver = RuntimeDriver(SID, sandbox)  # type: ignore[arg-type]
    held = Held()
    assert run(driver.start(), held) == []
    assert run(driver.execute(execute(), "controller")) == []  # held, not run yet
    assert sandbox.runtime.executed == []
    effects = finish(held)
    assert isinstance(effects[0], ToParent) and isinstance(effects[0].msg, RuntimeReady)
    assert Reply("controller", Executed(session_id=SID, action_id="a1", outcome=OK)) in effects
    assert sandbox.runtime.executed == ["a1"]


def test_a_close_during_the_start_waits_for_it_then_stops_what_it_brought_up():
    sandbox = FakeSandbox()
    driver = RuntimeDriver(SID, sandbox)  # type: ignore[arg-type]
    held = Held()
    run(driver.start(), held)
    run(driver.execute(execute(), "controller"))
    close = CloseSandbox(request_id="c1")
    assert run(driver.close(close, "supervisor")) == []  # answered once the start is done
    assert sandbox.cancels == 1  # a start waiting for an unreachable server is cut short
    effects = finish(held)
    assert [type(e) for e in effects] == [Drop, Reply]  # the held action never runs
    assert effects[1] == Reply("supervisor", SandboxClosed(request_id="c1", session_id=SID))
    assert sandbox.stops == 1 and sandbox.runtime.executed == []
    dropped = run(driver.execute(execute("a2"), "controller"))
    assert [type(e) for e in dropped] == [Drop]  # nothing more starts once closing


def test_two_closes_share_one_stop_and_both_are_answered():
    driver, sandbox, _ = ready()
    held = Held()
    run(driver.close(CloseSandbox(request_id="c1"), "one"), held)
    assert run(driver.close(CloseSandbox(request_id="c2"), "two")) == []
    assert [r.request_id for r in replies(finish(held))] == ["c1", "c2"]
    assert sandbox.stops == 1


def test_a_failed_start_is_reported_then_the_proxy_exits():
    sandbox = FakeSandbox()
    sandbox.start_error = RuntimeUnavailable("no engine")
    driver = RuntimeDriver(SID, sandbox)  # type: ignore[arg-type]
    effects = run(driver.start())
    assert [type(e) for e in effects] == [ToParent, Exit]
    failed = effects[0].msg
    assert isinstance(failed, RuntimeFailed) and failed.cause == RuntimeFailure.START_FAILED
    assert "no engine" in failed.detail


def test_a_newer_proxy_owning_the_sandbox_supersedes_this_one():
    driver, sandbox, _ = ready()
    sandbox.runtime.execute_errors.append(StaleEpoch("epoch 7 is older than 8"))
    effects = run(driver.execute(execute(), "controller"))
    assert [type(e) for e in effects] == [ToParent, Exit]
    assert isinstance(effects[0].msg, Superseded)
    assert run(driver.execute(execute("a2"), "controller"))[0].why.startswith("the proxy is")


def test_a_dead_sandbox_is_reported_with_its_own_cause_not_the_refused_request():
    driver, sandbox, _ = ready()
    sandbox.runtime.execute_errors.append(RuntimeUnavailable("connection refused"))
    sandbox.health = SandboxHealth(alive=False, cause=RuntimeFailure.EXITED, detail="OOMKilled")
    effects = run(driver.execute(execute(), "controller"))
    failed = effects[0].msg
    assert isinstance(failed, RuntimeFailed) and failed.cause == RuntimeFailure.EXITED
    assert failed.detail == "OOMKilled" and isinstance(effects[1], Exit)


def test_a_journal_that_cannot_write_is_said_once_and_retried_with_growing_waits():
    driver, sandbox, _ = ready()
    full = StoreUnavailable("the disk is full")
    sandbox.runtime.execute_errors += [full, full]
    msg = execute()
    first = run(driver.execute(msg, "controller"))
    assert [type(e) for e in first] == [Reply, After]
    assert isinstance(first[0].msg, JournalFault) and first[0].msg.cause == "the disk is full"
    second = run(driver.execute(msg, "controller"))  # the timer's try: still full
    assert [type(e) for e in second] == [After]  # not said again
    assert second[0].delay_s == 2 * first[1].delay_s
    third = run(driver.execute(msg, "controller"))
    assert [type(r) for r in replies(third)] == [JournalFault, Executed]
    assert replies(third)[0].cause is None  # the fault is over, then the outcome
    assert sandbox.runtime.executed == ["a1"]


def test_a_running_action_is_asked_again_until_the_journal_knows_its_end():
    driver, sandbox, _ = ready()
    sandbox.runtime.records += [
        JournalRecord(action_id="a1", state="running"),
        JournalRecord(action_id="a1", state="finished", outcome=OK),
    ]
    effects = run(driver.resolve(ResolveAction(session_id=SID, action_id="a1"), "controller"))
    assert effects == [Reply("controller", Resolved(session_id=SID, action_id="a1",
                                                    state="finished", outcome=OK))]


def test_an_action_for_another_session_is_dropped_never_run():
    driver, sandbox, _ = ready()
    effects = run(driver.execute(execute(session_id="s-other"), "controller"))
    assert [type(e) for e in effects] == [Drop] and sandbox.runtime.executed == []


def test_a_failed_health_check_reports_once_and_exits():
    driver, sandbox, _ = ready()
    sandbox.health = SandboxHealth(alive=False, cause=RuntimeFailure.EXITED, detail="exit 137")
    effects = run(driver.health_due("timer"))
    assert [type(e) for e in effects] == [ToParent, Exit]
    assert run(driver.health_due("timer")) == [Drop("timer", "the proxy is stopping")]


def test_a_close_answers_after_the_action_in_flight_came_back_with_its_outcome():
    """What the sandbox's stop brings back (an action's outcome, the one the stop gave it)
    goes out before the close's answer, so the core records it before the end."""
    driver, sandbox, _ = ready()
    held = Held()
    assert run(driver.execute(execute(), "controller"), held) == []  # on its worker
    close = CloseSandbox(request_id="end")
    assert run(driver.close(close, "core")) == []  # stopped, but the action is not back
    assert sandbox.stops == 1
    effects = finish(held)
    assert replies(effects) == [Executed(session_id=SID, action_id="a1", outcome=OK),
                                SandboxClosed(request_id="end", session_id=SID)]


def test_a_request_the_close_cut_short_is_not_a_failure():
    driver, sandbox, _ = ready()
    held = Held()
    run(driver.execute(execute(), "controller"), held)
    run(driver.close(CloseSandbox(request_id="end"), "core"))
    sandbox.runtime.execute_errors.append(RuntimeUnavailable("connection refused"))
    effects = finish(held)  # the server was stopped under it: no RuntimeFailed, no exit
    assert [type(e) for e in effects] == [Reply]
    assert replies(effects) == [SandboxClosed(request_id="end", session_id=SID)]


def test_the_driver_reports_a_misconfigured_start_and_does_not_exit_to_be_restarted():
    sandbox = FakeSandbox()
    sandbox.start_error = RuntimeMisconfigured("image 'x' is missing: build it")
    driver = RuntimeDriver(SID, sandbox)  # type: ignore[arg-type]
    effects = run(driver.start())
    report, = [e for e in effects if isinstance(e, ToParent)]
    assert isinstance(report.msg, RuntimeFailed)
    assert report.msg.cause == RuntimeFailure.MISCONFIGURED
    assert report.msg.detail == "image 'x' is missing: build it"
    assert not [e for e in effects if isinstance(e, Exit)]  # an exit would be restarted
    assert isinstance(run(driver.execute(execute(), "controller"))[0], Drop)  # runs nothing

    healable = FakeSandbox()
    healable.start_error = RuntimeUnavailable("the Docker engine does not answer")
    effects = run(RuntimeDriver(SID, healable).start())  # type: ignore[arg-type]
    assert [e.msg.cause for e in effects if isinstance(e, ToParent)] == [
        RuntimeFailure.START_FAILED]
    assert [e for e in effects if isinstance(e, Exit)]  # exits: its supervisor retries
