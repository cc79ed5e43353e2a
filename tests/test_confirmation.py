"""Confirmation mode through the Python API, on real processes: a session waits with its
action shown; approve runs it, reject records it ``rejected`` and the agent carries on."""

from __future__ import annotations

import pytest

from trouper import AgentState, ConfirmationEvent, ObservationEvent, Trouper
from trouper.exceptions import InvalidRequest

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it


def test_approve_runs_the_action_and_reject_is_recorded_with_its_reason(
        trouper: Trouper, scripted, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo approved > a.txt"}},
        {"tool": "run", "args": {"command": "rm -rf b.txt"}},
        {"tool": "finish", "args": {"message": "done"}},
    ])
    (tmp_path / "b.txt").write_text("keep me\n")
    session = trouper.start_session("t", llm=llm, workspace=tmp_path, confirm="always")
    assert session.wait(timeout=60) == AgentState.AWAITING_USER_CONFIRMATION
    waiting = session.awaiting_confirmation
    assert waiting is not None and waiting.action.command == "echo approved > a.txt"
    assert not (tmp_path / "a.txt").exists()  # nothing ran before the approval
    with pytest.raises(InvalidRequest, match="not the one waiting"):
        session.approve(action_id="not-this-one")
    session.approve(action_id=waiting.action_id)
    assert session.wait(timeout=60) == AgentState.AWAITING_USER_CONFIRMATION
    second = session.awaiting_confirmation
    assert second is not None and second.action.command == "rm -rf b.txt"
    assert (tmp_path / "a.txt").read_text() == "approved\n"
    session.reject("keep b.txt")
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "b.txt").read_text() == "keep me\n"
    events = list(session.events())
    answers = [(e.approved, e.reason) for e in events if isinstance(e, ConfirmationEvent)]
    assert answers == [(True, ""), (False, "keep b.txt")]
    outcomes = {e.action_id: e.outcome for e in events if isinstance(e, ObservationEvent)}
    assert outcomes[waiting.action_id].status == "ok"
    assert outcomes[second.action_id].status == "rejected"
    assert "keep b.txt" in outcomes[second.action_id].content
    with pytest.raises(InvalidRequest, match="no action waits"):
        session.approve()
