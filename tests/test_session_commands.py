"""Which of the user's commands a session takes in each state (``SessionInfo.commands``,
what the page enables its buttons by), read from the session core's table."""

from __future__ import annotations

from trouper.client.info import commands_in
from trouper.messages.actions import RunCommand
from trouper.messages.events import ActionEvent, AgentState

S = AgentState
WAITING = ActionEvent(action_id="a1", turn_id="t1", tool_call_id="c1", tool="run",
                      arguments='{"command": "ls"}', action=RunCommand(command="ls"))


def test_a_finished_session_takes_stop_only_and_a_stopped_one_resume_only():
    assert commands_in(S.FINISHED, None) == ("stop",)
    assert commands_in(S.STOPPED, None) == ("resume",)


def test_a_running_session_may_be_paused_or_stopped_but_not_resumed():
    assert commands_in(S.RUNNING, None) == ("pause", "stop")
    assert commands_in(S.PAUSED, None) == ("resume", "stop")


def test_approve_and_reject_only_while_an_action_waits():
    assert "approve" not in commands_in(S.AWAITING_USER_CONFIRMATION, None)
    assert commands_in(S.AWAITING_USER_CONFIRMATION, WAITING)[-2:] == ("approve", "reject")
