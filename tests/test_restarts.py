"""The restart policy and budget on a fake clock: no actor, no sleep."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from trouper.config.models import RestartPolicy
from trouper.supervisor import RestartBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_intensity_restarts_fit_in_the_period_then_the_budget_says_give_up():
    clock = Clock()
    budget = RestartBudget(RestartPolicy(intensity=3, period_s=60), clock, random.Random(1))
    assert [budget.allow() for _ in range(4)] == [True, True, True, False]
    clock.now += 59
    assert not budget.allow() and not budget.quiet()
    clock.now += 2  # the first restarts leave the window
    assert budget.allow()


def test_a_calm_period_empties_the_window_and_reset_starts_a_new_one():
    clock = Clock()
    budget = RestartBudget(RestartPolicy(intensity=2, period_s=10), clock)
    budget.allow()
    assert not budget.quiet()
    clock.now += 10.5
    assert budget.quiet()
    budget.allow()
    budget.reset()
    assert budget.allow() and budget.allow()  # a clean budget: the full intensity again
    budget.reset()
    # but not calm: a death right after a cooldown's restart is the next give-up round
    # (it once was, so the rounds never passed 1 and never ended)
    assert not budget.quiet()
    clock.now += 10.5
    assert budget.quiet()


def test_backoff_is_full_jitter_under_a_doubling_capped_ceiling():
    clock = Clock()
    policy = RestartPolicy(intensity=100, backoff_initial_s=0.1, backoff_max_s=1.0)
    budget = RestartBudget(policy, clock, random.Random(7))
    ceilings = []
    for _ in range(8):
        budget.allow()
        waits = [budget.backoff_s() for _ in range(200)]
        assert min(waits) >= 0.0
        ceilings.append(max(waits))
    assert ceilings[0] == 0.0  # the first restart in the window is at once
    assert ceilings[1] <= 0.1 and ceilings[2] <= 0.2 and ceilings[3] <= 0.4
    assert max(ceilings) <= 1.0 and ceilings[-1] > 0.9  # capped, and the cap is reached
    assert min(budget.backoff_s() for _ in range(200)) < 0.1  # full jitter: down to 0


def test_the_cooldown_doubles_per_round_up_to_its_cap_then_stays_down():
    policy = RestartPolicy(giveup_cooldown_s=30, giveup_cooldown_max_s=100, giveup_rounds=4)
    assert [policy.cooldown_s(n) for n in range(1, 6)] == [30, 60, 100, 100, None]
    assert RestartPolicy(giveup_rounds=0).cooldown_s(1) is None


@pytest.mark.parametrize("bad", [{"intensity": -1}, {"period_s": 0}, {"backoff_max_s": -1},
                                 {"giveup_rounds": -2}, {"strategy": "one_for_all"}])
def test_a_policy_refuses_what_cannot_work(bad):
    with pytest.raises(ValidationError):
        RestartPolicy(**bad)


def test_failed_restarts_within_the_intensity_then_gives_up_for_rounds_of_cooldown():
    clock = Clock()
    policy = RestartPolicy(intensity=1, period_s=60, giveup_rounds=2, giveup_cooldown_s=30,
                           giveup_cooldown_max_s=45)
    budget = RestartBudget(policy, clock, random.Random(3))
    assert budget.failed() == (True, 0.0)  # the first restart at once
    assert budget.failed() == (False, 30.0) and budget.given_up and budget.rounds == 1
    budget.restarted(by_hand=False)  # the cooldown's end: the rounds go on
    assert not budget.given_up
    budget.failed()
    assert budget.failed() == (False, 45.0) and budget.rounds == 2  # doubled, capped
    budget.restarted(by_hand=False)
    budget.failed()
    assert budget.failed() == (False, None)  # past the last round: down until restarted
    budget.restarted(by_hand=True)  # a user's resume grants every round again
    assert budget.rounds == 0 and budget.failed() == (True, 0.0)


def test_a_calm_period_forgets_the_give_up_rounds():
    clock = Clock()
    budget = RestartBudget(RestartPolicy(intensity=1, period_s=60), clock)
    budget.failed()
    budget.failed()
    assert budget.rounds == 1
    budget.restarted(by_hand=False)
    clock.now += 61
    assert budget.failed() == (True, 0.0) and budget.rounds == 0
