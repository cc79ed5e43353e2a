"""Whole sessions through the Python API, on multiprocTCPBase, against a scripted LLM."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from trouper import (
    ActionEvent,
    AgentState,
    ConfigError,
    MessageEvent,
    ObservationEvent,
    StateChanged,
    Trouper,
    UnknownSession,
)
from trouper.client.session import Session
from trouper.config.models import LLMConfig, SessionConfig
from trouper.home.paths import Home
from trouper.store import open_store
from trouper.testing import check_log

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

FINISH = {"tool": "finish", "args": {"message": "done"}}


def outcomes(session) -> list:
    return [e.outcome for e in session.events() if isinstance(e, ObservationEvent)]


def test_multi_step_session_makes_real_files(trouper, scripted, tmp_path):
    server, llm = scripted([
        {"tool": "run", "args": {"command": "echo one >> ledger.txt"}},
        {"tool": "write_file", "args": {"path": "hello.txt", "content": "hi"}},
        {"tools": [{"tool": "run", "args": {"command": "cat hello.txt"}},
                   {"tool": "think", "args": {"thought": "it says hi"}}]},
        {"say": "Done for now. Anything else?"},
        {"tool": "run", "args": {"command": "echo two >> ledger.txt"}},
        FINISH,
    ])
    session = trouper.start_session("make hello.txt", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
    assert (tmp_path / "hello.txt").read_text() == "hi"
    session.send("also append two to the ledger")
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "ledger.txt").read_text() == "one\ntwo\n"
    events = list(session.events())
    assert check_log(events, [r.body["messages"] for r in server.requests]) == []
    assert [o.content for o in outcomes(session)][2] == "hi"
    texts = [(e.source, e.text) for e in events if isinstance(e, MessageEvent)]
    assert texts == [("user", "make hello.txt"), ("agent", "Done for now. Anything else?"),
                     ("user", "also append two to the ledger")]


def test_shell_state_persists_between_commands(trouper, scripted, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "mkdir -p sub && cd sub && export GREETING=hey"}},
        {"tool": "run", "args": {"command": "pwd; echo $GREETING"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert outcomes(session)[1].content.split() == [str(tmp_path / "sub"), "hey"]


def test_malformed_tool_calls_become_rejected_outcomes(trouper, scripted, tmp_path):
    server, llm = scripted([
        {"tool": "run", "raw_args": "{not json"},
        {"tool": "launch_rockets", "args": {"count": 3}},
        {"tool": "edit_file", "args": {"path": "x.txt", "new": "b"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    first_three = outcomes(session)[:3]
    assert [o.status for o in first_three] == ["rejected"] * 3
    assert "launch_rockets" in first_three[1].content
    assert "old" in first_three[2].content
    # the model saw each rejection as the answer to its call
    last_prompt = server.requests[-1].body["messages"]
    tool_texts = [m["content"] for m in last_prompt if m["role"] == "tool"]
    assert any("old" in text for text in tool_texts)
    assert check_log(list(session.events())) == []


def test_max_iterations_stops_with_reason_and_resume_continues(trouper, scripted, tmp_path):
    step = {"tool": "run", "args": {"command": "echo x >> count.txt"}}
    _, llm = scripted([step, step, step, FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path, max_iterations=2)
    assert session.wait(timeout=60) == AgentState.STOPPED
    assert "max_iterations" in session.record.state_reason
    assert (tmp_path / "count.txt").read_text() == "x\nx\n"
    session.resume()
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "count.txt").read_text() == "x\nx\nx\n"


def test_max_cost_stops_the_session(trouper, scripted, tmp_path):
    step = {"tool": "think", "args": {"thought": "hmm " * 50}}
    _, llm = scripted([step] * 10 + [FINISH])
    llm = {**llm, "input_cost_per_token": 0.001, "output_cost_per_token": 0.001}
    session = trouper.start_session("t", llm=llm, workspace=tmp_path, max_cost_usd=0.2)
    assert session.wait(timeout=60) == AgentState.STOPPED
    assert "max_cost_usd" in session.record.state_reason
    view = session.view()
    assert 0.2 <= view.cost_usd and view.total_iterations < 10


def test_secrets_reach_the_shell_and_are_masked_everywhere(trouper, trouper_home, scripted,
                                                           tmp_path):
    secret = "sekrit-value-93731"
    server, llm = scripted([
        {"tool": "run", "args": {"command": "echo token=$API_TOKEN"}},
        {"tool": "write_file", "args": {"path": "f.txt", "content": f"copy {secret}"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path,
                                    secrets={"API_TOKEN": secret})
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert outcomes(session)[0].content.strip() == "token=<secret:API_TOKEN>"
    actions = [e for e in session.events() if isinstance(e, ActionEvent)]
    assert secret not in actions[1].arguments and "<secret:API_TOKEN>" in actions[1].arguments
    assert (tmp_path / "f.txt").read_text() == f"copy {secret}"  # the action itself ran as sent
    for path in trouper_home.glob("trouper.db*"):
        data = path.read_bytes()
        assert secret.encode() not in data, path
        assert b"test-key" not in data, path
    assert all(secret not in str(r.body["messages"]) for r in server.requests)


def test_pause_resume_and_stop(trouper, scripted, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo a"}, "delay_s": 1.0},
        {"tool": "run", "args": {"command": "echo b"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    session.pause()
    assert session.wait(timeout=30) == AgentState.PAUSED
    session.resume()
    assert session.wait(timeout=60) == AgentState.FINISHED
    with pytest.raises(Exception, match="finished"):
        session.resume()
    session.stop()
    assert session.state == AgentState.STOPPED
    assert check_log(list(session.events())) == []


def test_unknown_session_and_bad_config_are_clear_errors(trouper):
    with pytest.raises(UnknownSession, match="s-nope"):
        trouper.session("s-nope")
    with pytest.raises(ConfigError, match="max_iterations"):
        trouper.start_session("t", llm={"model": "x"}, max_iterations="many")
    with pytest.raises(ConfigError, match="modle"):
        trouper.start_session("t", llm={"modle": "x"})


def test_events_replay_after_close_and_reopen(scripted, tmp_path):
    home, workspace = tmp_path / "home", tmp_path / "ws"
    _, llm = scripted([{"tool": "run", "args": {"command": "echo hi"}}, FINISH])
    with Trouper(home=home) as first:
        session = first.start_session("t", llm=llm, workspace=workspace)
        assert session.wait(timeout=60) == AgentState.FINISHED
        before = [e.model_dump() for e in session.events()]
    with Trouper(home=home) as second:
        again = second.session(session.id)
        after = [e.model_dump() for e in again.events()]
        assert after == before
        assert [e["seq"] for e in after] == list(range(1, len(after) + 1))
        assert again.state == AgentState.FINISHED
        assert [s.id for s in second.sessions()] == [session.id]
        followed = list(again.events(since=2, follow=True, timeout_s=5))
        assert [e.seq for e in followed] == list(range(3, len(after) + 1))
        assert isinstance(followed[-1], StateChanged) and followed[-1].settled


def test_workspace_instructions_reach_the_prompt(trouper, scripted, tmp_path: Path):
    (tmp_path / "AGENTS.md").write_text("Always answer in haiku.")
    server, llm = scripted([FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    system = server.requests[0].body["messages"][0]
    assert system["role"] == "system" and "Always answer in haiku." in system["content"]


def test_timeouts_in_a_row_trip_the_breaker(trouper, scripted, tmp_path):
    slow = {"tool": "run", "args": {"command": "sleep 30"}}
    _, llm = scripted([slow, slow, slow, FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path, command_timeout_s=0.5,
                                    max_consecutive_timeouts=3)
    assert session.wait(timeout=60) == AgentState.PAUSED
    assert "3 commands in a row timed out" in session.record.state_reason
    assert [o.timed_out for o in outcomes(session)] == ["hard"] * 3
    assert all(o.status == "error" for o in outcomes(session))


def test_soft_timeout_hands_back_control_while_the_command_runs(trouper, scripted, tmp_path):
    wait_more = {"tool": "run", "args": {"command": ""}}
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo begun; sleep 1.5; echo ended"}},
        *[wait_more] * 8,
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path, no_output_timeout_s=0.4)
    assert session.wait(timeout=60) == AgentState.FINISHED
    seen = outcomes(session)
    assert seen[0].still_running and seen[0].timed_out == "soft" and "begun" in seen[0].content
    end = next(i for i, o in enumerate(seen) if "ended" in o.content)
    assert end >= 1 and seen[end].exit_code == 0 and not seen[end].still_running
    assert all(o.still_running for o in seen[:end])


# -- wait() through states that will move again by themselves ---------------------------

class _TrouperOfAStore:
    """What a Session asks of its Trouper (a store, and the fault the tree reports), so
    wait() can be driven state by state in a few milliseconds."""

    def __init__(self, home: Path) -> None:
        self.store = open_store(Home.at(home))
        self.cause: str | None = None

    def fault(self, session_id: str, timeout_s: float | None = None) -> str | None:
        return self.cause


@pytest.fixture
def logged(tmp_path: Path):
    trouper = _TrouperOfAStore(tmp_path / "home")
    config = SessionConfig(task="t", llm=LLMConfig(model="hosted_vllm/x"),
                           workspace=str(tmp_path))
    trouper.store.create_session("s-1", config)
    yield trouper, Session(trouper, "s-1")  # type: ignore[arg-type]
    trouper.store.close()


def _state(trouper, state: AgentState, resumes_in_s: float | None = None) -> None:
    resumes_at = None if resumes_in_s is None else (
        datetime.now(UTC) + timedelta(seconds=resumes_in_s))
    trouper.store.append("s-1", [StateChanged(state=state, resumes_at=resumes_at)])


def _waited(session: Session, timeout: float) -> tuple[AgentState, float]:
    started = time.monotonic()
    return session.wait(timeout=timeout), time.monotonic() - started


def test_wait_waits_through_an_error_with_resumes_at(logged):
    trouper, session = logged
    _state(trouper, AgentState.ERROR, resumes_in_s=30)  # a cooldown past the intensity
    state, took_s = _waited(session, 0.5)
    assert state == AgentState.ERROR and took_s >= 0.5  # not settled: waited its timeout
    answer: list[AgentState] = []
    waiter = threading.Thread(target=lambda: answer.append(session.wait(timeout=30)))
    waiter.start()
    _state(trouper, AgentState.RUNNING)
    _state(trouper, AgentState.FINISHED)
    waiter.join(timeout=30)
    assert answer == [AgentState.FINISHED]


def test_wait_returns_at_once_on_an_error_that_waits_for_the_user(logged):
    trouper, session = logged
    _state(trouper, AgentState.ERROR)
    state, took_s = _waited(session, 30)
    assert state == AgentState.ERROR and took_s < 1.0


def test_wait_waits_through_a_storage_fault_even_when_the_log_reads_settled(logged):
    trouper, session = logged
    _state(trouper, AgentState.AWAITING_USER_INPUT)
    trouper.cause = "the disk holding the store is full"  # the user's message not recorded
    state, took_s = _waited(session, 0.7)
    assert state == AgentState.ERROR and took_s >= 0.7
    answer: list[AgentState] = []
    waiter = threading.Thread(target=lambda: answer.append(session.wait(timeout=30)))
    waiter.start()
    trouper.cause = None
    waiter.join(timeout=30)
    assert answer == [AgentState.AWAITING_USER_INPUT]


def test_a_command_named_by_its_request_id_is_carried_out_once(trouper, scripted, tmp_path):
    _, llm = scripted([{"say": "What next?"}, {"say": "And?"}])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
    first = trouper.command(session.id, "send", "go on", request_id="mine-1")
    again = trouper.command(session.id, "send", "go on", request_id="mine-1")
    said = [e for e in session.events() if isinstance(e, MessageEvent) and e.source == "user"]
    assert [e.text for e in said] == ["t", "go on"]
    assert said[-1].command_id == "mine-1" and again == said[-1].seq <= first
    with pytest.raises(ConfigError) as refused:
        trouper.command(session.id, "send", "x", request_id="no spaces")
    assert refused.value.field == "request_id"
