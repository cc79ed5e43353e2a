"""The broker's retry and rate-limit policy, seen through whole sessions."""

from __future__ import annotations

import time

import pytest

from trouper import AgentState, LLMRetry, StateChanged, Trouper
from trouper.config.settings import env_name
from trouper.messages.events import PromptCondensed
from trouper.testing import check_log, wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

FINISH = {"tool": "finish", "args": {"message": "done"}}
RUN = {"tool": "run", "args": {"command": "echo x >> ledger.txt"}}
TOO_LONG = ("This model's maximum context length is 50 tokens. However, your messages "
            "resulted in 90 tokens.")


def events_of(session, kind) -> list:
    return [e for e in session.events() if isinstance(e, kind)]


def test_two_429s_then_success_are_two_visible_retries(trouper, scripted, tmp_path):
    server, llm = scripted([
        {**RUN, "fail": [{"status": 429, "retry_after": 0.2}, {"status": 429,
                                                               "retry_after": 0.3}]},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    retries = events_of(session, LLMRetry)
    assert [(r.attempt, r.wait_s, r.error_class) for r in retries] == [
        (2, 0.2, "rate_limit"), (3, 0.3, "rate_limit")]
    step0 = [r.time_s for r in server.requests if r.step == 0]
    assert len(step0) == 3 and step0[1] - step0[0] >= 0.2 and step0[2] - step0[1] >= 0.3
    prompts = [r.body["messages"] for r in server.requests]
    assert check_log(list(session.events()), prompts) == []
    assert all("429" not in str(p) and "rate" not in str(p).lower() for p in prompts)


def test_429s_past_the_retries_rate_limit_then_resume_by_themselves(trouper, scripted,
                                                                    tmp_path):
    _, llm = scripted([
        {**RUN, "fail": [{"status": 429, "retry_after": 1}] * 2},
        FINISH,
    ])
    session = trouper.start_session("t", llm={**llm, "num_retries": 1}, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    changes = events_of(session, StateChanged)
    limited = next(c for c in changes if c.state == AgentState.RATE_LIMITED)
    assert limited.resumes_at is not None and not limited.settled
    after = changes[changes.index(limited) + 1]
    assert after.state == AgentState.RUNNING and after.ts >= limited.resumes_at


def test_resume_lifts_a_rate_limit_at_once(trouper, scripted, tmp_path):
    _, llm = scripted([{**RUN, "fail": [{"status": 429, "retry_after": 600}]}, FINISH])
    session = trouper.start_session("t", llm={**llm, "num_retries": 0}, workspace=tmp_path)
    wait_until(lambda: session.state == AgentState.RATE_LIMITED, 30, "RATE_LIMITED")
    assert session.wait(timeout=0.5) == AgentState.RATE_LIMITED  # not settled: it will go on
    started = time.monotonic()
    session.resume()
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert time.monotonic() - started < 30


def test_authentication_error_fails_at_once_without_retry(trouper, scripted, tmp_path):
    server, llm = scripted([{**RUN, "fail": [{"status": 401, "message": "bad key"}]}, FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.ERROR
    assert "auth" in session.record.state_reason and "bad key" in session.record.state_reason
    assert len(server.requests) == 1 and events_of(session, LLMRetry) == []


def test_pause_during_a_backoff_wait_cancels_it(trouper, scripted, tmp_path):
    server, llm = scripted([{**RUN, "fail": [{"status": 503}]}, FINISH])
    llm = {**llm, "retry_min_wait_s": 1.5, "retry_max_wait_s": 1.5}
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    wait_until(lambda: events_of(session, LLMRetry), 30, "a retry to be scheduled")
    log = trouper.home.root / "logs" / "trouper.log"
    line = "its call was cancelled during the backoff"
    before = log.read_text().count(line)  # the home is shared by this module's tests
    session.pause()
    # the retry's timer still fires, 1.5 s after it was set, and finds its call cancelled:
    # the broker says so in one log line, the moment the retry would have gone out
    wait_until(lambda: log.read_text().count(line) > before, 30,
               "the cancelled retry's timer to fire")
    assert len(server.requests) == 1
    assert session.state == AgentState.PAUSED
    session.resume()
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert len(server.requests) == 3


def test_context_overflow_condenses_the_prompt_and_carries_on(trouper, scripted, tmp_path):
    server, llm = scripted([RUN, RUN, RUN, {**RUN, "fail": [{"status": 400,
                                                            "message": TOO_LONG}]}, FINISH])
    # the same command four times is a loop to stuck detection: off, this test is the cut's
    session = trouper.start_session("t", llm=llm, workspace=tmp_path, stuck=False)
    assert session.wait(timeout=60) == AgentState.FINISHED
    condensed = events_of(session, PromptCondensed)
    assert len(condensed) == 1 and condensed[0].dropped > 0
    overflowed, retried = [r.body["messages"] for r in server.requests if r.step == 3]
    assert len(retried) < len(overflowed)
    assert retried[:2] == overflowed[:2]  # the system message and the task stay
    assert "condensed" in retried[2]["content"]
    assert (tmp_path / "ledger.txt").read_text() == "x\n" * 4
    assert check_log(list(session.events())) == []


def test_context_still_too_long_after_condensing_is_an_error(trouper, scripted, tmp_path):
    overflow = {"status": 400, "message": TOO_LONG}
    _, llm = scripted([RUN, RUN, {**RUN, "fail": [overflow, overflow]}, FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.ERROR
    assert "context_window" in session.record.state_reason


def test_fallback_model_after_the_primary_is_spent(trouper, scripted, tmp_path):
    server, llm = scripted([{**RUN, "fail": [{"status": 503}] * 2}, FINISH])
    llm = {**llm, "model": "hosted_vllm/primary", "fallbacks": ["hosted_vllm/backup"],
           "num_retries": 1, "retry_min_wait_s": 0.05, "retry_max_wait_s": 0.05}
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    retries = events_of(session, LLMRetry)
    assert [r.model for r in retries] == ["hosted_vllm/primary", "hosted_vllm/backup"]
    assert "falling back to hosted_vllm/backup" in retries[1].message
    assert [r.body["model"] for r in server.requests if r.step == 0] == [
        "primary", "primary", "backup"]


def test_a_429_cools_down_every_session_on_the_key(trouper, scripted, tmp_path):
    server, llm = scripted([{**RUN, "fail": [{"status": 429, "retry_after": 1.5}]}, FINISH])
    first = trouper.start_session("t", llm=llm, workspace=tmp_path / "a")
    limited = wait_until(lambda: next((r for r in server.requests if r.status == 429), None),
                         30, "the 429")
    second = trouper.start_session("t", llm=llm, workspace=tmp_path / "b")
    assert first.wait(timeout=60) == second.wait(timeout=60) == AgentState.FINISHED
    key = server.requests[-1].headers["x-trouper-session"]
    later = [r for r in server.requests if r.headers["x-trouper-session"] == second.id]
    assert key and later and later[0].time_s >= limited.time_s + 1.4


@pytest.mark.slow
def test_twenty_sessions_on_one_key_never_exceed_its_rpm(scripted, tmp_path, monkeypatch):
    rpm, window_s = 60, 6.0
    # A 6 s window instead of a minute: 80 calls at 60 per window take seconds, not minutes.
    monkeypatch.setenv(env_name("rate_window_s"), str(window_s))  # read by the forked broker
    server, llm = scripted([RUN, RUN, RUN, FINISH], rpm=rpm, rpm_window_s=window_s)
    with Trouper(home=tmp_path / "home") as trouper:  # its own: the window is read at the fork
        sessions = [trouper.start_session("t", llm={**llm, "rpm": rpm},
                                          workspace=tmp_path / str(i)) for i in range(20)]
        for session in sessions:
            assert session.wait(timeout=60) == AgentState.FINISHED
    times = sorted(r.time_s for r in server.requests)
    statuses = [(r.status, r.step) for r in server.requests if r.status != 200]
    assert statuses == [] and len(times) == 80  # the server 429s past its rpm
    for i, start in enumerate(times):
        in_window = sum(1 for t in times[i:] if t < start + window_s)
        assert in_window <= rpm, f"{in_window} requests in the {window_s} s from {start}"
