"""The hosted layout's sandbox supervision (``runtimes/hosted.py``), one input at a time, on
a fake backend and a fake clock: what it tells the core, when it replaces a failed
driver, when it gives up, and what a failed driver's late results become (nothing)."""

from __future__ import annotations

from typing import Any

from trouper.config.models import RestartPolicy
from trouper.core.effects import RuntimeDown, RuntimeReplaced
from trouper.exceptions import RuntimeUnavailable, StaleEpoch
from trouper.messages.protocol import (
    CloseSandbox,
    Executed,
    ResolveAction,
    RuntimeFailed,
    RuntimeFailure,
    RuntimeReady,
    SandboxClosed,
)
from trouper.messages.tree import Superseded
from trouper.runtimes.base import JournalRecord, SandboxHealth
from trouper.runtimes.driver import After, Drop, Reply, ToParent, Work
from trouper.runtimes.hosted import TIMER, HostedRuntime, ToCore
from trouper.testing.fake_sandbox import OK, SID, FakeSandbox, Held, execute, finish, run


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def hosted(**policy: Any) -> tuple[HostedRuntime, list[FakeSandbox], Clock]:
    sandboxes: list[FakeSandbox] = []

    def make(incarnation: int) -> FakeSandbox:
        sandboxes.append(FakeSandbox())
        return sandboxes[-1]

    clock = Clock()
    policy.setdefault("backoff_initial_s", 0.5)
    runtime = HostedRuntime(SID, make, RestartPolicy(**policy), clock)  # type: ignore[arg-type]
    return runtime, sandboxes, clock


def to_core(effects: list[Any]) -> list[Any]:
    return [e.msg for e in effects if isinstance(e, ToCore)]


def booted(**policy: Any) -> tuple[HostedRuntime, list[FakeSandbox], Clock]:
    runtime, sandboxes, clock = hosted(**policy)
    assert to_core(run(runtime.boot())) == [RuntimeReady(session_id=SID, epoch=7,
                                                         attached=False)]
    return runtime, sandboxes, clock


def dead(sandbox: FakeSandbox) -> None:
    """The sandbox's next action fails, and its health says it died."""
    sandbox.runtime.execute_errors.append(RuntimeUnavailable("connection refused"))
    sandbox.health = SandboxHealth(alive=False, cause=RuntimeFailure.EXITED, detail="SIGKILL")


def test_an_action_runs_in_process_and_its_outcome_goes_to_the_core():
    runtime, sandboxes, _ = booted()
    effects = run(runtime.handle(execute()))
    assert to_core(effects) == [Executed(session_id=SID, action_id="a1", outcome=OK)]
    assert sandboxes[0].runtime.executed == ["a1"]


def test_the_drivers_timers_carry_its_incarnation_and_come_back_to_it():
    runtime, _, _ = hosted()
    effects = run(runtime.boot())
    timer = next(e for e in effects if isinstance(e, After))
    assert timer.name == TIMER and timer.token[:2] == (1, "health")
    assert [type(e) for e in run(runtime.on_timer(timer.token))] == [After]  # alive: again


def test_a_failed_driver_is_replaced_at_once_and_the_core_asks_the_journal():
    runtime, sandboxes, _ = booted()
    dead(sandboxes[0])
    effects = run(runtime.handle(execute()))
    told = to_core(effects)
    assert isinstance(told[0], RuntimeFailed) and told[0].cause == RuntimeFailure.EXITED
    assert told[1] == RuntimeReplaced()
    assert told[2] == RuntimeReady(session_id=SID, epoch=7, attached=False)
    assert len(sandboxes) == 2 and runtime.incarnation == 2
    assert sandboxes[0].runtime.executed == []  # the action is the journal's to say


def test_a_failed_drivers_late_results_and_timers_are_dropped():
    runtime, sandboxes, _ = booted()
    held = Held()
    assert run(runtime.handle(execute()), held) == []  # in flight on a worker
    first_health = (1, "health", None)
    assert to_core(run(runtime.crash("killed by the test"))) == [
        RuntimeFailed(session_id=SID, epoch=0, cause=RuntimeFailure.EXITED,
                      detail="killed by the test"),
        RuntimeReplaced(),
        RuntimeReady(session_id=SID, epoch=7, attached=False),
    ]
    late = finish(held)  # the old driver's execute comes back: not for the core
    assert to_core(late) == [] and all(isinstance(e, Drop) for e in late)
    assert all(isinstance(e, Drop) for e in runtime.on_timer(first_health))


def test_a_second_failure_in_the_window_waits_a_backoff_timer():
    runtime, sandboxes, _ = booted(intensity=5)
    run(runtime.crash("one"))
    effects = run(runtime.crash("two"))
    assert RuntimeReplaced() not in to_core(effects)
    timer = next(e for e in effects if isinstance(e, After))
    assert timer.token[1:] == ("restart", "two") and 0 <= timer.delay_s <= 0.5
    assert isinstance(run(runtime.handle(execute()))[0], Drop)  # down: nothing to run it
    assert RuntimeReplaced() in to_core(run(runtime.on_timer(timer.token)))
    assert len(sandboxes) == 3


def test_past_the_intensity_the_core_is_told_down_until_the_user_resumes():
    runtime, sandboxes, _ = booted(intensity=1, giveup_rounds=0)
    run(runtime.crash("one"))
    effects = run(runtime.crash("two"))
    down = to_core(effects)[-1]
    assert isinstance(down, RuntimeDown) and down.resumes_at is None
    assert "the sandbox failed 2 times" in down.reason and "resume" in down.reason
    assert not any(isinstance(e, After) for e in effects) and len(sandboxes) == 2
    resumed = run(runtime.restart("resumed by the user"))
    assert to_core(resumed)[:2] == [RuntimeReplaced(),
                                    RuntimeReady(session_id=SID, epoch=7, attached=False)]
    assert not runtime.given_up and len(sandboxes) == 3
    assert RuntimeReplaced() in to_core(run(runtime.crash("three")))  # a clean budget


def test_a_give_up_round_ends_with_a_fresh_driver_after_its_cooldown():
    runtime, sandboxes, _ = booted(intensity=1, giveup_rounds=1, giveup_cooldown_s=30)
    run(runtime.crash("one"))
    effects = run(runtime.crash("two"))
    down = to_core(effects)[-1]
    assert isinstance(down, RuntimeDown) and down.resumes_at is not None
    cooldown = next(e for e in effects if isinstance(e, After))
    assert cooldown.delay_s == 30 and cooldown.token[1] == "cooldown_over"
    assert RuntimeReplaced() in to_core(run(runtime.on_timer(cooldown.token)))
    assert len(sandboxes) == 3


def test_a_calm_period_forgets_earlier_failures():
    runtime, _, clock = booted(intensity=1, period_s=60)
    run(runtime.crash("one"))
    clock.now += 61
    assert RuntimeReplaced() in to_core(run(runtime.crash("two, a minute later")))


def test_close_stops_the_sandbox_answers_and_no_driver_starts_after():
    runtime, sandboxes, _ = booted()
    effects = run(runtime.close(CloseSandbox(request_id="r"), "supervisor"))
    assert effects == [Reply("supervisor", SandboxClosed(request_id="r", session_id=SID))]
    assert sandboxes[0].stops == 1
    assert to_core(run(runtime.crash("after the close"))) == []
    assert len(sandboxes) == 1


def test_close_while_the_sandbox_is_given_up_still_stops_it():
    runtime, sandboxes, _ = booted(intensity=0, giveup_rounds=0)
    run(runtime.crash("gone"))
    assert run(runtime.close(CloseSandbox(request_id="r"), "supervisor")) == [
        Reply("supervisor", SandboxClosed(request_id="r", session_id=SID))]
    assert len(sandboxes) == 2 and sandboxes[-1].stops == 1  # a fresh backend, not started
    assert to_core(run(runtime.restart("resumed after the close"))) == []


def test_a_close_waits_for_a_failed_drivers_start_then_stops_what_it_brought_up():
    runtime, sandboxes, _ = hosted()
    held = Held()
    run(runtime.boot(), held)
    run(runtime.crash("failed while starting"))
    assert run(runtime.close(CloseSandbox(request_id="r"), "root")) == []  # waits for it
    effects = finish(held)
    assert [e for e in effects if isinstance(e, Reply)] == [
        Reply("root", SandboxClosed(request_id="r", session_id=SID))]
    assert sandboxes[-1].stops == 1 and to_core(effects) == []


def test_a_sandbox_that_serves_a_newer_runtime_means_stand_down_not_restart():
    runtime, sandboxes, _ = booted()
    sandboxes[0].runtime.execute_errors.append(StaleEpoch("epoch 8 is newer"))
    effects = run(runtime.handle(execute()))
    assert [type(e.msg) for e in effects if isinstance(e, ToParent)] == [Superseded]
    assert RuntimeReplaced() not in to_core(effects) and len(sandboxes) == 1


def test_requests_before_the_sandbox_is_ready_wait_for_it():
    runtime, sandboxes, _ = hosted()
    held = Held()
    assert run(runtime.boot(), held) == []
    assert run(runtime.handle(ResolveAction(session_id=SID, action_id="a0"))) == []
    assert run(runtime.handle(execute())) == []
    sandboxes[0].runtime.records.append(JournalRecord(action_id="a0", state="finished",
                                                      outcome=OK))
    effects = finish(held)
    assert [type(m).__name__ for m in to_core(effects)] == ["RuntimeReady", "Resolved",
                                                           "Executed"]
    assert not any(isinstance(e, Work) for e in effects)



def test_after_the_last_give_up_round_the_sandbox_stays_down_until_a_resume():
    runtime, sandboxes, _ = booted(intensity=0, giveup_rounds=1, giveup_cooldown_s=30)
    effects = run(runtime.crash("one"))
    cooldown = next(e for e in effects if isinstance(e, After))
    run(runtime.on_timer(cooldown.token))  # round 1 over: a fresh driver
    effects = run(runtime.crash("two, right after"))
    down = to_core(effects)[-1]
    assert isinstance(down, RuntimeDown) and down.resumes_at is None, down
    assert not any(isinstance(e, After) for e in effects) and len(sandboxes) == 2


def test_a_driver_failed_while_its_sandbox_starts_is_replaced_once_that_start_is_done():
    """Two starts at once could both claim the sandbox, the failed one last: it would
    fence the new driver out. The new one waits for the old start to come back."""
    runtime, sandboxes, _ = hosted()
    held = Held()
    assert run(runtime.boot(), held) == []  # starting on a worker
    assert to_core(run(runtime.crash("failed while starting"))) == []
    assert len(sandboxes) == 1  # no second start yet
    effects = finish(held)  # the old start comes back: dropped, and the new one starts
    assert to_core(effects) == [RuntimeReplaced(),
                                RuntimeReady(session_id=SID, epoch=7, attached=False)]
    assert len(sandboxes) == 2 and runtime.incarnation == 2


# -- a stopped session's sandbox ends -----------------------------------------------------


def test_an_end_stops_the_sandbox_tells_the_core_and_starts_nothing_until_a_restart():
    from trouper.core.effects import SandboxEnded

    runtime, sandboxes, clock = booted()
    effects = run(runtime.end("stopped by the user"))
    assert to_core(effects) == [SandboxEnded()] and sandboxes[0].stops == 1
    assert to_core(run(runtime.crash("a fault injected"))) == []  # no driver runs to fail
    assert [type(e) for e in run(runtime.on_timer((runtime.incarnation, "restart", "late")))
            ] == [Drop]
    assert len(sandboxes) == 1  # nothing started again
    effects = run(runtime.restart("the session goes on"))
    assert to_core(effects) == [RuntimeReplaced(), RuntimeReady(session_id=SID, epoch=7,
                                                                attached=False)]
    assert len(sandboxes) == 2


def test_an_end_with_no_driver_running_stops_what_is_left_and_a_restored_one_boots_none():
    from trouper.core.effects import SandboxEnded

    runtime, sandboxes, _ = hosted()
    effects = run(runtime.end("restored stopped"))  # before the boot, as a restored core asks
    assert to_core(effects) == [SandboxEnded()]
    assert [s.stops for s in sandboxes] == [1]  # a stop-only driver: nothing was started
    assert run(runtime.boot()) == [] and len(sandboxes) == 1
