"""A looping agent, end to end: a real session on a scripted model that repeats itself is
PAUSED with the pattern named, makes no further model call, and carries on to its end
once the user sends a hint and resumes it."""

from __future__ import annotations

import pytest

from trouper import AgentState
from trouper.core.states import Why
from trouper.messages.events import StateChanged

pytestmark = pytest.mark.slow  # a real session

LOOP = {"tool": "run", "args": {"command": "echo waiting for the server"}}
FINISH = {"tool": "finish", "args": {"message": "done"}}


def test_a_looping_agent_is_paused_naming_the_loop_and_a_hint_carries_it_on(
        trouper, scripted, tmp_path):
    server, llm = scripted([LOOP, LOOP, LOOP, LOOP, FINISH])
    session = trouper.start_session("start the server", llm=llm,
                                    workspace=tmp_path / "ws")
    assert session.wait(timeout=90) == AgentState.PAUSED
    info = session.info()
    assert "same result 4 times" in info.reason
    assert "run echo waiting for the server" in info.reason
    assert len(server.requests) == 4  # no question after the fourth repeat
    changes = [e for e in session.events() if isinstance(e, StateChanged)]
    assert changes[-1].cause == Why.STUCK
    session.send("the server is already up: finish")
    session.resume()
    assert session.wait(timeout=90) == AgentState.FINISHED
    assert "the server is already up" in str(server.requests[-1].body)
    assert len([e for e in session.events() if isinstance(e, StateChanged)
                and e.cause == Why.STUCK]) == 1


def test_a_session_with_detection_off_runs_its_loop_to_the_end(trouper, scripted, tmp_path):
    _, llm = scripted([LOOP] * 6 + [FINISH])
    session = trouper.start_session("start the server", llm=llm, stuck=False,
                                    workspace=tmp_path / "ws")
    assert session.wait(timeout=90) == AgentState.FINISHED
