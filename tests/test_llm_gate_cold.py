"""A cold gate (no call answered yet) counts each call until its end plus a window.

A fresh broker's first calls can reach the provider seconds after their admission (litellm
imports and builds its clients on the first call), so counting them from admission let a
server that counts its own window see more than ``rpm`` requests in it.
"""

from __future__ import annotations

import pytest

from trouper.llm.gate import AdmissionGate, GateLimits

WINDOW_S, MARGIN_S = 6.0, 1.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def cold_gate(clock: Clock, **limits: int) -> AdmissionGate:
    return AdmissionGate(GateLimits(**limits), clock, margin_s=MARGIN_S, window_s=WINDOW_S)


def queue(gate: AdmissionGate, count: int, prefix: str = "t", est_tokens: int = 1) -> list[str]:
    tickets = [f"{prefix}{i}" for i in range(count)]
    for ticket in tickets:
        gate.request(ticket, "s", est_tokens)
    return tickets


def test_a_call_admitted_cold_counts_until_its_end_plus_a_window(clock):
    gate = cold_gate(clock, rpm=2)
    first, second, third = queue(gate, 3)
    assert gate.admit() == [first, second]
    clock.now = 30.0  # far past admission + window + margin: still in flight, still counted
    assert gate.admit() == [] and gate.next_admission_in_s() is None
    gate.release(first, actual_tokens=5)  # it may have reached the provider just now
    assert gate.next_admission_in_s() == WINDOW_S
    clock.now = 30.0 + WINDOW_S
    assert gate.admit() == [third]


def test_the_first_answer_makes_the_gate_warm(clock):
    gate = cold_gate(clock, rpm=2)
    first, second, third, fourth = queue(gate, 4)
    assert gate.admit() == [first, second]  # cold calls are not held back, only counted
    clock.now = 2.0
    gate.release(first, actual_tokens=5)  # answered: the path to the provider is warm
    gate.release(second, actual_tokens=5)
    clock.now = 8.0
    assert gate.admit() == [third, fourth]  # both cold entries left at 2 + 6
    assert gate.next_admission_in_s() is None  # nothing queued
    queue(gate, 1, prefix="late")
    assert gate.next_admission_in_s() == WINDOW_S + MARGIN_S  # warm: counted from admission


def test_an_error_or_a_cancel_bounds_the_entry_but_leaves_the_gate_cold(clock):
    gate = cold_gate(clock, rpm=1)
    first, second, third = queue(gate, 3)
    assert gate.admit() == [first]
    clock.now = 3.0
    gate.release(first)  # an error: no answer, so nothing says the path is warm
    clock.now = 3.0 + WINDOW_S
    assert gate.admit() == [second]
    gate.cancel(second)  # a cancel at once: it still counts a window (and margin) from admission
    assert gate.next_admission_in_s() == WINDOW_S + MARGIN_S
    clock.now = 3.0 + 2 * WINDOW_S + MARGIN_S
    assert gate.admit() == [third]
    assert gate.next_admission_in_s() is None


def test_a_quick_cold_call_still_counts_a_whole_window_from_admission(clock):
    gate = cold_gate(clock, rpm=1)
    first, second = queue(gate, 2)
    assert gate.admit() == [first]
    clock.now = 0.1
    gate.release(first, actual_tokens=1)
    assert gate.next_admission_in_s() == pytest.approx(WINDOW_S + MARGIN_S - 0.1)


def test_tokens_of_a_cold_call_count_until_its_end_plus_a_window(clock):
    gate = cold_gate(clock, tpm=100)
    big, small = queue(gate, 1, "big", est_tokens=90)[0], queue(gate, 1, "small", 20)[0]
    assert gate.admit() == [big]
    assert gate.next_admission_in_s() is None
    clock.now = 4.0
    gate.release(big, actual_tokens=95)
    assert gate.stats()["tokens_in_window"] == 95
    assert gate.next_admission_in_s() == WINDOW_S
    clock.now = 4.0 + WINDOW_S
    assert gate.admit() == [small]


def test_a_retried_ticket_is_counted_once_per_attempt(clock):
    gate = cold_gate(clock, rpm=3)
    gate.request("call", "s", 1)
    assert gate.admit() == ["call"]
    gate.release("call")  # a 503: the broker retries the same request id
    gate.request("call", "s", 1)
    assert gate.admit() == ["call"]
    clock.now = 2.0
    gate.release("call", actual_tokens=1)
    assert gate.stats()["requests_in_window"] == 2
    clock.now = 7.0  # the first attempt left at 0 + 6 + 1; the second stays until 2 + 6
    assert gate.stats()["requests_in_window"] == 1
