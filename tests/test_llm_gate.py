"""The shared admission gate: sliding windows, fairness, cooldowns and headers, on a fake clock."""

from __future__ import annotations

import heapq
import random
from collections import deque

import pytest
from pydantic import ValidationError

from trouper.llm.gate import AdmissionGate, GateKey, GateLimits, GateRegistry, estimate_tokens
from trouper.llm.headers import parse_duration_s


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_gate(clock: FakeClock, **limits: int) -> AdmissionGate:
    return AdmissionGate(GateLimits(**limits), clock=clock, window_s=60.0, warm=True)


def queue(gate: AdmissionGate, session: str, count: int, est_tokens: int = 1) -> list[str]:
    tickets = [f"{session}{i}" for i in range(count)]
    for ticket in tickets:
        gate.request(ticket, session, est_tokens)
    return tickets


def test_rpm_is_a_sliding_window_and_the_next_admission_is_exact(clock):
    gate = make_gate(clock, rpm=60)
    tickets = queue(gate, "a", 61)
    assert gate.admit() == tickets[:60]
    assert gate.next_admission_in_s() == 60.0
    clock.now = 59.5
    assert gate.admit() == []
    assert gate.next_admission_in_s() == 0.5
    clock.now = 60.0
    assert gate.next_admission_in_s() == 0.0
    assert gate.admit() == [tickets[60]]
    assert gate.next_admission_in_s() is None


def test_rpm_window_counts_only_the_last_60_s(clock):
    gate = make_gate(clock, rpm=4)
    queue(gate, "a", 2)
    assert len(gate.admit()) == 2
    clock.now = 10.0
    later = queue(gate, "b", 3)
    assert gate.admit() == later[:2]
    assert gate.next_admission_in_s() == 50.0  # the admissions at t=0 leave at t=60
    clock.now = 60.0
    assert gate.admit() == later[2:]
    assert gate.stats()["requests_in_window"] == 3


def test_tpm_estimate_then_correction_lowers_and_raises_usage(clock):
    gate = make_gate(clock, tpm=1000)
    gate.request("a", "s1", 600)
    assert gate.admit() == ["a"]
    clock.now = 5.0
    gate.request("b", "s1", 600)
    assert gate.admit() == []
    assert gate.next_admission_in_s() == 55.0
    gate.release("a", actual_tokens=300)  # lower than estimated: b fits now
    assert gate.next_admission_in_s() == 0.0
    assert gate.admit() == ["b"]
    gate.request("c", "s1", 200)
    gate.release("b", actual_tokens=800)  # higher: 300 + 800 in the window
    assert gate.stats()["tokens_in_window"] == 1100
    assert gate.admit() == []
    assert gate.next_admission_in_s() == 55.0  # a (300) leaves at t=60: 800 + 200 <= 1000
    clock.now = 60.0
    assert gate.admit() == ["c"]


def test_a_correction_after_the_window_passed_changes_nothing(clock):
    gate = make_gate(clock, tpm=100)
    gate.request("a", "s", 50)
    assert gate.admit() == ["a"]
    clock.now = 61.0
    gate.release("a", actual_tokens=90)
    assert gate.stats()["tokens_in_window"] == 0


def test_a_ticket_bigger_than_tpm_waits_for_an_empty_window(clock):
    gate = make_gate(clock, tpm=100)
    gate.request("small", "s", 50)
    assert gate.admit() == ["small"]
    gate.request("big", "s", 500)
    assert gate.admit() == []
    assert gate.next_admission_in_s() == 60.0
    clock.now = 60.0
    assert gate.admit() == ["big"]
    gate.request("after", "s", 10)
    assert gate.next_admission_in_s() == 60.0  # the window holds 500 > 100 until t=120
    clock.now = 120.0
    assert gate.admit() == ["after"]


def test_a_ticket_bigger_than_tpm_is_admitted_at_once_on_an_empty_window(clock):
    gate = make_gate(clock, tpm=100)
    gate.request("big", "s", 10_000)
    assert gate.admit() == ["big"]


def test_concurrency_is_freed_by_release(clock):
    gate = make_gate(clock, max_concurrency=2)
    tickets = queue(gate, "a", 3)
    assert gate.admit() == tickets[:2]
    assert (gate.in_flight(), gate.waiting()) == (2, 1)
    assert gate.next_admission_in_s() is None  # only a release can help
    gate.release(tickets[0], actual_tokens=5)
    gate.release(tickets[0])  # twice: ignored
    gate.release("unknown")
    assert gate.next_admission_in_s() == 0.0
    assert gate.admit() == tickets[2:]
    assert (gate.in_flight(), gate.waiting()) == (2, 0)


def test_cooldown_blocks_and_extends_but_never_shortens(clock):
    gate = make_gate(clock)
    gate.request("a", "s", 1)
    gate.cooldown(10.0)
    assert gate.admit() == []
    assert gate.next_admission_in_s() == 10.0
    clock.now = 2.0
    gate.cooldown(5.0)  # until 7: shorter, ignored
    gate.cooldown(-1.0)
    gate.cooldown(float("nan"))
    assert gate.next_admission_in_s() == 8.0
    gate.cooldown(20.0)  # until 22: extends
    assert gate.stats()["cooldown_until"] == 22.0
    clock.now = 21.0
    assert gate.admit() == []
    clock.now = 22.0
    assert gate.admit() == ["a"]
    assert gate.stats()["cooldown_until"] is None


def test_a_session_with_one_call_is_not_starved_by_one_with_fifty(clock):
    gate = make_gate(clock, max_concurrency=1)
    busy = queue(gate, "a", 50)
    admitted = gate.admit()
    assert admitted == [busy[0]]
    gate.request("b0", "b", 1)
    for _ in range(2):  # capacity frees twice
        gate.release(admitted[-1])
        admitted += gate.admit()
    assert "b0" in admitted[1:3]


def test_a_session_with_one_call_is_served_when_the_window_frees(clock):
    gate = make_gate(clock, rpm=2)
    busy = queue(gate, "a", 50)
    assert gate.admit() == busy[:2]
    clock.now = 1.0
    gate.request("b0", "b", 1)
    clock.now = 60.0
    assert gate.admit() == [busy[2], "b0"]


def test_round_robin_across_sessions_fifo_within(clock):
    gate = make_gate(clock, rpm=3)
    a = queue(gate, "a", 5)
    b = queue(gate, "b", 2)
    c = queue(gate, "c", 1)
    assert gate.admit() == [a[0], b[0], c[0]]
    clock.now = 60.0
    assert gate.admit() == [a[1], b[1], a[2]]
    clock.now = 120.0
    assert gate.admit() == [a[3], a[4]]


def test_a_newcomer_goes_behind_sessions_already_waiting(clock):
    gate = make_gate(clock, max_concurrency=1)
    a = queue(gate, "a", 3)
    b = queue(gate, "b", 3)
    order = gate.admit()
    gate.request("c0", "c", 1)
    for _ in range(4):
        gate.release(order[-1])
        order += gate.admit()
    assert order == [a[0], b[0], a[1], "c0", b[1]]


def test_the_next_ticket_in_fair_order_is_not_overtaken(clock):
    gate = make_gate(clock, tpm=100)
    gate.request("a0", "a", 60)
    assert gate.admit() == ["a0"]
    gate.request("b0", "b", 60)  # does not fit until t=60
    gate.request("c0", "c", 10)  # would fit, but waits its turn
    assert gate.admit() == []
    clock.now = 60.0
    assert gate.admit() == ["b0", "c0"]


def test_cancel_a_queued_or_an_admitted_ticket(clock):
    gate = make_gate(clock, max_concurrency=1, rpm=10)
    gate.request("a0", "a", 1)
    gate.request("a0", "a", 1)  # idempotent
    gate.request("a1", "a", 1)
    gate.request("b0", "b", 1)
    assert gate.waiting() == 3
    gate.cancel("b0")
    assert gate.waiting() == 2
    assert gate.stats()["queued"] == {"a": 2}
    assert gate.admit() == ["a0"]
    gate.request("a0", "a", 1)  # in flight: ignored
    assert gate.waiting() == 1
    gate.cancel("a0")  # admitted: frees the slot, still counts in the window
    gate.cancel("unknown")
    assert gate.admit() == ["a1"]
    assert gate.stats()["requests_in_window"] == 2


def test_configure_strictest_wins(clock):
    gate = make_gate(clock, rpm=100, max_concurrency=5)
    gate.configure(GateLimits(rpm=50, tpm=1000))
    assert gate.limits == GateLimits(rpm=50, tpm=1000, max_concurrency=5)
    gate.configure(GateLimits(rpm=80))
    gate.configure(GateLimits())
    assert gate.limits == GateLimits(rpm=50, tpm=1000, max_concurrency=5)


def test_limits_are_validated():
    with pytest.raises(ValidationError):
        GateLimits(rpm=0)
    with pytest.raises(ValidationError):
        GateLimits(rmp=5)


def test_registry_shares_one_gate_per_key(clock):
    registry = GateRegistry(clock=clock, window_s=60.0)
    key = GateKey.of("openai/gpt-4o", "http://127.0.0.1:9/v1/", "sk-secret")
    assert key.api_base == "http://127.0.0.1:9/v1"
    assert "sk-secret" not in repr(key)
    first = registry.gate(key, GateLimits(rpm=60))
    same = registry.gate(
        GateKey.of("openai/gpt-4o", "http://127.0.0.1:9/v1", "sk-secret"),
        GateLimits(rpm=30, tpm=500),
    )
    assert same is first
    assert first.limits == GateLimits(rpm=30, tpm=500)
    other = registry.gate(GateKey.of("openai/gpt-4o", None, "sk-other"), GateLimits())
    assert other is not first
    assert set(registry.gates()) == {key, GateKey.of("openai/gpt-4o", None, "sk-other")}
    assert GateKey.of("m", None, None) == GateKey(api_base="", key_id="", model="m")


def test_headers_teach_limits_that_only_tighten_config(clock):
    gate = make_gate(clock, rpm=100)
    gate.observe_headers({"x-ratelimit-limit-requests": "50", "x-ratelimit-limit-tokens": "4000"})
    assert gate.limits == GateLimits(rpm=50, tpm=4000)
    gate.observe_headers({"X-RateLimit-Limit-Requests": "500"})
    assert gate.limits == GateLimits(rpm=100, tpm=4000)  # never looser than config


def test_headers_with_nothing_remaining_start_a_cooldown(clock):
    gate = make_gate(clock)
    gate.request("a", "s", 1)
    gate.observe_headers(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"}
    )
    assert gate.next_admission_in_s() == 1.5
    gate.observe_headers({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"})
    assert gate.next_admission_in_s() == 360.0
    gate.observe_headers({"x-ratelimit-remaining-tokens": "7", "x-ratelimit-reset-tokens": "9m"})
    assert gate.next_admission_in_s() == 360.0


@pytest.mark.parametrize(
    "headers",
    [
        {"x-ratelimit-limit-requests": "abc", "x-ratelimit-limit-tokens": "-5"},
        {"x-ratelimit-limit-requests": "0", "x-ratelimit-limit-tokens": "1.5"},
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "soon"},
        {"x-ratelimit-remaining-requests": "none", "x-ratelimit-reset-requests": "1s"},
        {"x-ratelimit-remaining-tokens": "0"},
        {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "-1s"},
        {},
    ],
)
def test_malformed_headers_are_ignored(clock, headers):
    gate = make_gate(clock, rpm=10)
    gate.request("a", "s", 1)
    gate.observe_headers(headers)
    assert gate.limits == GateLimits(rpm=10)
    assert gate.admit() == ["a"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("0.5s", 0.5),
        ("1s", 1.0),
        ("1.5", 1.5),
        ("0", 0.0),
        ("1h2m3s", 3723.0),
        ("2m59.56s", 179.56),
        (" 7s ", 7.0),
        ("", None),
        ("soon", None),
        ("-1s", None),
        ("1e3", None),
        ("inf", None),
        ("5x", None),
        ("s", None),
    ],
)
def test_parse_duration_s(text, seconds):
    result = parse_duration_s(text)
    if seconds is None:
        assert result is None
    else:
        assert result == pytest.approx(seconds)


def test_estimate_tokens():
    assert estimate_tokens([]) == 1
    messages = [{"role": "user", "content": "x" * 400}]
    estimate = estimate_tokens(messages)
    assert 100 <= estimate <= 120
    tools = [{"type": "function", "function": {"name": "bash", "description": "y" * 400}}]
    assert estimate_tokens(messages, tools) >= estimate + 100
    assert estimate_tokens(messages, []) == estimate


@pytest.mark.parametrize(("seed", "window_s"), [(s, 60.0) for s in range(8)] + [(8, 6.0)])
def test_random_traffic_never_exceeds_rpm_and_every_ticket_is_admitted(seed, window_s):
    """Random arrivals and releases over a simulated 10 minutes (times are multiples of 1/8 s,
    so clock arithmetic is exact): no window holds more than 60 admissions, every ticket
    is admitted once, and the gate's timer is exact (it always admits when it fires)."""
    rng = random.Random(seed)
    clock = FakeClock()
    limits = GateLimits(rpm=60, max_concurrency=rng.choice([None, 3, 8]))
    gate = AdmissionGate(limits, clock, window_s=window_s)
    sessions = [f"s{i}" for i in range(rng.randint(1, 6))]
    bursts = [rng.randrange(600 * 8) for _ in range(rng.randint(5, 30))]  # in 1/8 s
    times = [min(600 * 8 - 1, rng.choice(bursts) + rng.randrange(80)) for _ in range(900)]
    arrivals = sorted((t / 8, f"t{i}") for i, t in enumerate(times[: rng.randint(300, 900)]))
    pending = deque(arrivals)
    releases: list[tuple[float, str]] = []
    admitted_at: dict[str, float] = {}
    for _ in range(100_000):
        if not pending and not releases and gate.waiting() == 0:
            break
        timer = gate.next_admission_in_s()
        candidates = [clock.now + timer] if timer is not None else []
        candidates += [pending[0][0]] if pending else []
        candidates += [releases[0][0]] if releases else []
        clock.now = max(clock.now, min(candidates))
        while pending and pending[0][0] <= clock.now:
            _, ticket = pending.popleft()
            gate.request(ticket, rng.choice(sessions), rng.randint(1, 50))
        while releases and releases[0][0] <= clock.now:
            _, ticket = heapq.heappop(releases)
            gate.release(ticket, actual_tokens=rng.randint(1, 80))
        admitted = gate.admit()
        if timer is not None and clock.now == candidates[0]:
            assert admitted, f"timer fired at {clock.now} but nothing was admitted"
        for ticket in admitted:
            assert ticket not in admitted_at
            admitted_at[ticket] = clock.now
            heapq.heappush(releases, (clock.now + rng.randrange(1, 20 * 8) / 8, ticket))
    assert set(admitted_at) == {ticket for _, ticket in arrivals}
    times = sorted(admitted_at.values())
    for i, start in enumerate(times):
        in_window = sum(1 for t in times[i:] if t < start + window_s)
        assert in_window <= 60, f"{in_window} admissions in the {window_s} s from {start}"
    assert gate.in_flight() == 0


def test_lift_cooldown_ends_it_now(clock):
    gate = make_gate(clock)
    gate.cooldown(60)
    gate.request("t1", "s", 10)
    assert gate.admit() == []
    gate.lift_cooldown()
    assert gate.admit() == ["t1"]
