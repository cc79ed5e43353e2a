"""The broker's backoff on a seeded random source: bounds, growth, cap, Retry-After, budget."""

from __future__ import annotations

import random

import pytest

from trouper.config.models import LLMConfig
from trouper.llm.backoff import Backoff

DRAWS = 400


def backoff(min_s: float = 1.0, max_s: float = 60.0, total_s: float = 300.0,
            seed: int = 7) -> Backoff:
    return Backoff(min_s, max_s, total_s, random.Random(seed))


def draws(policy: Backoff, retry: int) -> list[float]:
    return [policy.wait_s(retry) for _ in range(DRAWS)]


@pytest.mark.parametrize("retry", range(1, 9))
def test_each_wait_is_drawn_from_the_whole_range_above_the_floor(retry):
    ceiling = min(60.0, 2.0**retry)
    waits = draws(backoff(), retry)
    assert all(1.0 <= w <= ceiling for w in waits)
    spread = ceiling - 1.0  # full jitter: both ends of the range are reached
    assert min(waits) < 1.0 + 0.05 * spread and max(waits) > ceiling - 0.05 * spread


def test_the_first_retry_is_already_jittered():
    waits = draws(backoff(), 1)
    assert len(set(waits)) == DRAWS and all(1.0 <= w <= 2.0 for w in waits)


def test_the_ceiling_doubles_then_stops_at_the_cap():
    policy = backoff(min_s=0.5, max_s=10.0)
    assert [policy.ceiling_s(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert policy.ceiling_s(10_000) == 10.0  # no overflow however many retries
    assert max(draws(policy, 50)) <= 10.0


def test_the_cap_wins_over_the_floor_and_a_zero_floor_retries_at_once():
    assert set(draws(backoff(min_s=5.0, max_s=2.0), 3)) == {2.0}
    assert set(draws(backoff(min_s=0.0), 4)) == {0.0}


def test_retry_after_is_honoured_exactly_up_to_the_cap():
    policy = backoff(min_s=1.0, max_s=60.0)
    assert policy.wait_s(3, retry_after_s=7.5) == 7.5
    assert policy.wait_s(1, retry_after_s=0.2) == 0.2  # the provider's word beats the floor
    assert policy.wait_s(1, retry_after_s=600.0) == 60.0
    assert policy.wait_s(1, retry_after_s=-3.0) == 0.0


def test_the_total_budget_caps_all_waits_of_one_call():
    policy = backoff(min_s=1.0, max_s=60.0, total_s=100.0)
    assert policy.within_budget(90.0, 10.0) and not policy.within_budget(90.0, 10.5)
    waited, retry = 0.0, 1
    while policy.within_budget(waited, wait := policy.wait_s(retry)):
        waited, retry = waited + wait, retry + 1
    assert waited <= 100.0 and retry > 3


def test_the_same_seed_gives_the_same_waits():
    assert draws(backoff(seed=3), 4) == draws(backoff(seed=3), 4)
    assert draws(backoff(seed=3), 4) != draws(backoff(seed=4), 4)


def test_a_session_config_gives_its_bounds():
    llm = LLMConfig(model="hosted_vllm/m", retry_min_wait_s=0.5, retry_max_wait_s=8,
                    retry_total_s=30)
    rng = random.Random(1)
    assert Backoff.of(llm, rng) == Backoff(0.5, 8.0, 30.0, rng)
