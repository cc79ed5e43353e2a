"""Fault edges: past the restart intensity a session waits out a cooldown and carries on."""

from __future__ import annotations

import pytest

from trouper import AgentState, ObservationEvent, RestartPolicy, StateChanged, Trouper
from trouper.testing import check_log, kill_sandbox

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

STEPS = 24


@pytest.mark.slow
def test_a_sandbox_killed_8_times_in_a_row_comes_back_by_itself(scripted, tmp_path):
    _, llm = scripted([{"tool": "run", "args": {"command": f"echo {i}; sleep 0.2"}}
                       for i in range(STEPS)] + [{"tool": "finish", "args": {"message": "ok"}}])
    policy = RestartPolicy(intensity=3, period_s=60, giveup_cooldown_s=1.0, giveup_rounds=3)
    with Trouper(home=tmp_path / "home", policy=policy) as t:
        session = t.start_session("survive", llm=llm, workspace=tmp_path / "ws",
                                  max_iterations=100)
        for _ in range(8):
            kill_sandbox(session)
        assert session.wait(timeout=120) == AgentState.FINISHED
        events = list(session.events())
    assert check_log(events) == []
    cooled = [e for e in events if isinstance(e, StateChanged) and e.state == AgentState.ERROR
              and "trying again in" in e.reason]
    assert cooled and all(e.resumes_at is not None for e in cooled)


def test_a_command_during_the_agent_loops_cooldown_wakes_it_at_once(scripted, tmp_path):
    """Past the Controller's intensity the session waits out a long cooldown; a user's
    resume does not wait for it (nor time out): it starts the agent loop at once."""
    from trouper.testing import kill_actor, wait_until

    _, llm = scripted([{"tool": "run", "args": {"command": "touch started; sleep 1"}},
                       {"tool": "finish", "args": {"message": "ok"}}])
    policy = RestartPolicy(intensity=1, period_s=60, backoff_initial_s=0.01,
                           giveup_cooldown_s=600, giveup_rounds=3)
    with Trouper(home=tmp_path / "home", policy=policy, ask_timeout_s=10) as t:
        session = t.start_session("wake", llm=llm, workspace=tmp_path / "ws")
        wait_until(lambda: (tmp_path / "ws" / "started").exists(), 30, "the command to run")
        for _ in range(2):
            kill_actor(session, "controller")
        wait_until(lambda: session.view().state == AgentState.ERROR
                   and session.view().resumes_at is not None, 30, "the cooldown")
        session.resume()  # answered by the Controller it wakes, well within ask_timeout_s
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert check_log(list(session.events())) == []


def test_cooldowns_double_and_end(tmp_path):
    policy = RestartPolicy(giveup_cooldown_s=30, giveup_cooldown_max_s=100, giveup_rounds=4)
    assert [policy.cooldown_s(n) for n in range(1, 6)] == [30, 60, 100, 100, None]
    assert RestartPolicy(giveup_rounds=0).cooldown_s(1) is None


def test_lone_surrogates_and_binary_output_finish(scripted, tmp_path):
    """Any bytes in, valid text out (I6 in docs/promises.md): nothing a model or a command
    sends can stop it."""
    _, llm = scripted([
        {"tool": "run", "raw_args": '{"command": "echo \\ud800 half a pair \\udfff"}'},
        {"tool": "run", "args": {"command": "head -c 3000 /dev/urandom; printf '\\xff\\xfe\\x00'"}},
        {"say": "done \ud83d with a lone surrogate"},
    ])
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("odd bytes \udc80", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        events = list(session.events())
    assert check_log(events) == []
    outcomes = [e.outcome for e in events if isinstance(e, ObservationEvent)]
    assert [o.status for o in outcomes] == ["ok", "ok"]
    assert "\ufffd half a pair \ufffd" in outcomes[0].content
    for event in events:
        event.model_dump_json()  # every stored event is valid text
