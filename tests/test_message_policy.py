"""Messages while a session works, end to end: an interrupting message cancels a slow
model call and the model is asked again with it; a rejected one is refused by the API
naming the state."""

from __future__ import annotations

import pytest

from trouper import AgentState
from trouper.exceptions import InvalidRequest
from trouper.messages.events import LLMCompleted
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # real sessions

SLOW_FINISH = {"tool": "finish", "args": {"message": "done"}, "delay_s": 3.0}


def test_an_interrupting_message_cancels_a_slow_model_call(trouper, scripted, tmp_path):
    server, llm = scripted([SLOW_FINISH])
    session = trouper.start_session("set up the project", llm=llm,
                                    message_policy="interrupt", workspace=tmp_path / "ws")
    wait_until(lambda: len(server.requests) >= 1, 60, "the first model call")
    session.send("use python 3.12")
    assert session.wait(timeout=60) == AgentState.FINISHED
    bodies = [str(r.body) for r in server.requests]
    assert len(bodies) == 2  # asked again, with the message
    assert "use python 3.12" not in bodies[0] and "use python 3.12" in bodies[1]
    completed = [e for e in session.events() if isinstance(e, LLMCompleted)]
    assert len(completed) == 1  # the cancelled call's answer was never recorded


def test_a_message_to_a_running_session_that_rejects_them_is_refused(trouper, scripted,
                                                                     tmp_path):
    server, llm = scripted([SLOW_FINISH])
    session = trouper.start_session("set up the project", llm=llm, message_policy="reject",
                                    workspace=tmp_path / "ws")
    wait_until(lambda: len(server.requests) >= 1, 60, "the first model call")
    with pytest.raises(InvalidRequest, match="running and takes no message"):
        session.send("hurry up")
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert len(server.requests) == 1
