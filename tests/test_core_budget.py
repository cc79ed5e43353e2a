"""Budgets that ask, in the session core on a fake clock: a budget that runs out pauses
the session saying which and by how much (``on_budget="ask"``), the user's raise carries
it on (recorded, so a restored core keeps it), a raise that would still be spent is
refused, and with ``stop`` a raised budget lets a stopped session go on."""

from __future__ import annotations

import json
from typing import Any

from test_core_session import Clock, S, _log_of, answer, appended, call, make, only, running

from trouper.core.effects import Answer, AskModel, EndSandbox, RunAction, SandboxEnded
from trouper.core.session import SessionCore
from trouper.core.states import Why
from trouper.messages.events import BudgetChanged, StateChanged
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import Executed, RuntimeReady, UserCommand


def step(core: SessionCore, ask: AskModel, clock: Clock, cost: float = 0.0,
         n: int = 0) -> AskModel | None:
    effects = answer(core, ask, clock, call("run", command=f"echo {n}"), cost=cost)
    run = only(effects, RunAction)
    effects = core.handle(Executed(session_id="s-1", action_id=run.request.action_id,
                                   outcome=Outcome(status="ok", content=f"{n}")), clock.tick())
    asks = [e for e in effects if isinstance(e, AskModel)]
    return asks[0] if asks else None


def budget(core: SessionCore, clock: Clock, **limits: Any) -> tuple[Answer, list[Any]]:
    effects = core.handle(UserCommand(request_id=f"r-b{clock.now.timestamp()}",
                                      session_id="s-1", command="budget",
                                      text=json.dumps(limits)), clock.tick())
    if [e for e in effects if isinstance(e, EndSandbox)]:
        effects += core.handle(SandboxEnded(), clock.tick())
    return only(effects, Answer), effects


def last_change(core: SessionCore) -> StateChanged:
    return [e for e in _log_of(core) if isinstance(e, StateChanged)][-1]


def test_iterations_run_out_and_the_session_asks_then_a_raise_carries_it_on():
    core, clock, ask = running(max_iterations=2, on_budget="ask")
    ask = step(core, ask, clock, n=1)
    assert step(core, ask, clock, n=2) is None
    change = last_change(core)
    assert (core.view.state, change.cause) == (S.PAUSED, Why.BUDGET_ASK)
    assert "reached max_iterations (2 model calls)" in change.reason
    assert "raise it to carry on" in change.reason
    answered, effects = budget(core, clock, max_iterations=4)
    assert answered.error is None and core.view.state == S.RUNNING
    ask = only(effects, AskModel)
    assert [e for e in appended(effects) if isinstance(e, BudgetChanged)][0].max_iterations == 4
    ask = step(core, ask, clock, n=3)
    assert step(core, ask, clock, n=4) is None  # the raised budget, spent in turn
    assert "reached max_iterations (4 model calls)" in last_change(core).reason


def test_cost_runs_out_saying_by_how_much_and_a_raise_still_spent_is_refused():
    core, clock, ask = running(max_cost_usd=1.0, on_budget="ask")
    ask = step(core, ask, clock, cost=0.6, n=1)
    assert step(core, ask, clock, cost=0.6, n=2) is None
    reason = last_change(core).reason
    assert "spent $1.2000 of max_cost_usd $1.0000 (over by $0.2000)" in reason
    before = core.view.last_seq
    answered, _ = budget(core, clock, max_cost_usd=1.1)
    assert "would still be spent" in (answered.error or "")
    assert core.view.last_seq == before and core.view.state == S.PAUSED  # nothing changed
    answered, effects = budget(core, clock, max_cost_usd=2.0)
    assert answered.error is None and core.view.state == S.RUNNING
    only(effects, AskModel)


def test_a_restored_core_keeps_the_raised_budget():
    core, clock, ask = running(max_iterations=1, on_budget="ask")
    assert step(core, ask, clock, n=1) is None
    budget(core, clock, max_iterations=3)
    fresh, _ = make(max_iterations=1, on_budget="ask")
    fresh.restore(_log_of(core))
    effects = fresh.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True),
                           clock.tick())
    assert fresh.view.state == S.RUNNING
    only(effects, AskModel)  # not paused again: the log holds the raise


def test_with_stop_a_budget_raised_lets_a_stopped_session_go_on():
    core, clock, ask = running(max_cost_usd=1.0)  # on_budget="stop", the default
    assert step(core, ask, clock, cost=1.5, n=1) is None
    core.handle(SandboxEnded(), clock.tick())
    assert core.view.state == S.STOPPED and last_change(core).cause == Why.MAX_COST
    answered, _ = budget(core, clock, max_cost_usd=5.0)
    assert answered.error is None and core.view.state == S.STOPPED  # recorded, stays
    core.handle(UserCommand(request_id="r-resume", session_id="s-1", command="resume"),
                clock.tick())
    assert core.view.state == S.RUNNING  # before, the spent budget stopped it at once
    assert last_change(core).cause == Why.USER_RESUME


def test_a_budget_command_that_names_no_limit_or_a_bad_one_is_refused():
    core, clock, _ = running(max_iterations=5, on_budget="ask")
    for limits, said in (({}, "give max_cost_usd, max_iterations or both"),
                         ({"max_iterations": 0}, "max_iterations"),
                         ({"max_cost_usd": -1}, "max_cost_usd"),
                         ({"max_tokens": 5}, "max_tokens")):
        answered, effects = budget(core, clock, **limits)
        assert said in (answered.error or ""), (limits, answered)
        assert not appended(effects)
