"""The summarizing condenser, end to end: a real session on a scripted model whose prompt
passes its threshold asks the model for a summary of its older half, records it once,
goes on with the summary in its prompt, and after the program is closed and opened
again rebuilds that prompt without asking for a summary a second time."""

from __future__ import annotations

import pytest

from trouper import AgentState, Trouper
from trouper.messages.events import LLMCompleted, PromptCondensed

pytestmark = pytest.mark.slow  # real sessions

SUMMARY = "SUMMARY: the agent printed four long lines (a to d); nothing failed."


def long_output(letter: str) -> dict:
    return {"tool": "run", "args": {"command": f"yes {letter} | head -c 3000"}}


def test_a_long_session_is_summarized_once_and_a_restart_reuses_the_summary(
        tmp_path, scripted):
    finish = {"tool": "finish", "args": {"message": "done"}}
    steps = [long_output(c) for c in "abcd"] + [{"say": SUMMARY}] + [
        long_output("e"), finish, finish]
    server, llm = scripted(steps)
    options = {"condenser": "summarize", "summarize_at_tokens": 3000}
    home = tmp_path / "home"
    with Trouper(home=home) as t:
        session = t.start_session("print long lines", llm=llm, workspace=tmp_path / "ws",
                                  **options)
        assert session.wait(timeout=90) == AgentState.FINISHED
        sid = session.id
    bodies = [r.body or {} for r in server.requests]
    asked = [i for i, body in enumerate(bodies) if not body.get("tools")]
    assert asked == [4]  # one summary request, with no tools, at the fifth call
    assert "a\na\na" in bodies[4]["messages"][1]["content"]  # the transcript it summarizes
    assert all(SUMMARY in str(body["messages"]) for body in bodies[5:])
    with Trouper(home=home) as t:  # a new program: the session rebuilt from its log
        session = t.session(sid)
        seen = len(server.requests)
        session.send("one more thing")
        assert session.wait(timeout=90) == AgentState.FINISHED
        later = [r.body or {} for r in server.requests[seen:]]
        assert later and all(body.get("tools") for body in later)  # no second summary
        assert SUMMARY in str(later[0]["messages"])
        events = list(session.events())
    condensed = [e for e in events if isinstance(e, PromptCondensed)]
    assert [e.summary for e in condensed] == [SUMMARY]
    assert len([e for e in events if isinstance(e, LLMCompleted)]) == len(server.requests)
