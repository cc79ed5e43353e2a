"""Stop means stopped: a stopped session's shell and every job it started end at once, its
in-flight action gets one outcome saying so, and a resume goes on in a fresh sandbox.

Before, ``Session.stop()`` recorded STOPPED and left the sandbox running (the shell, a
``sleep 1000 &`` it started, the command in flight) until the settled session stood down,
``settled_stand_down_s`` (600 s) later; the command in flight ran to its end.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState, ObservationEvent, RuntimeEvent
from trouper.core.ending import SHELL_RESET
from trouper.host.processes import descendants, is_bash, pid_alive, session_members, start_time
from trouper.testing import check_log, wait_until
from trouper.testing.faults import sandbox_pid

pytestmark = pytest.mark.slow

FINISH = {"tool": "finish", "args": {"message": "done"}}
BUSY = "cd /tmp && export K=v; sleep 1000 & sleep 1000"
"""A background job and a command in flight (its hard timeout is far off)."""


def shell_of(session: Any) -> dict[int, int]:
    """The processes of the session's shell (pid -> start time): bash, its background job
    and the command it runs, once all three run."""
    server = sandbox_pid(session)
    leaders = [pid for pid in descendants([server]) if is_bash(pid) and os.getsid(pid) == pid
               ] if server else []
    members = session_members(leaders[0]) if leaders else {}
    return members if len(members) >= 3 else {}


def alive(processes: dict[int, int]) -> list[int]:
    return [pid for pid, started in processes.items()
            if pid_alive(pid) and start_time(pid) == started]


def ended(session: Any) -> bool:
    return any(isinstance(e, RuntimeEvent) and e.phase == "closed" for e in session.events())


def outcomes(session: Any) -> list:
    return [e.outcome for e in session.events() if isinstance(e, ObservationEvent)]


def test_stop_ends_the_shell_and_its_jobs_at_once_and_resume_goes_on_in_a_fresh_shell(
        trouper, scripted, tmp_path: Path):
    server, llm = scripted([{"tool": "run", "args": {"command": BUSY}},
                            {"tool": "run", "args": {"command": "echo $$ $PWD K=$K"}}, FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path,
                                    command_timeout_s=3600, no_output_timeout_s=3600)
    shell = wait_until(lambda: shell_of(session), 60, "the shell, its job and its command")
    session.stop()
    wait_until(lambda: ended(session), 30, "the stopped session's sandbox to end")
    assert alive(shell) == []  # bash, `sleep 1000 &` and the command in flight: all gone
    assert session.wait(timeout=30) == AgentState.STOPPED
    # one outcome, the stop's, never run again (I1, I2 in docs/promises.md)
    [interrupted] = outcomes(session)
    assert interrupted.status == "interrupted" and "stopped" in interrupted.content
    assert check_log(list(session.events())) == []

    session.resume()
    assert session.wait(timeout=60) == AgentState.FINISHED
    fresh = outcomes(session)[1]
    pid, cwd, k = fresh.content.split()
    assert int(pid) not in shell and cwd == str(tmp_path) and k == "K="  # state reset
    prompts = [request.body["messages"] for request in server.requests]
    assert SHELL_RESET in repr(prompts[-2])  # the agent was told, before its next command
    assert check_log(list(session.events()), prompts) == []
    assert len(outcomes(session)) == 3 and sum(o.status == "interrupted"
                                               for o in outcomes(session)) == 1


def remote_shell_of(server_pid: int) -> dict[int, int]:
    """The processes of the runtime server's one shell (bash, its job, its command)."""
    leaders = [pid for pid in descendants([server_pid]) if is_bash(pid)
               and os.getsid(pid) == pid]
    members = session_members(leaders[0]) if len(leaders) == 1 else {}
    return members if len(members) >= 3 else {}


def test_stop_ends_the_remote_shell_and_its_jobs_and_resume_starts_one_afresh(
        trouper, scripted, remote_server, tmp_path: Path, monkeypatch):
    monkeypatch.delenv("TROUPER_RUNTIME_TOKEN", raising=False)
    server = remote_server()
    _, llm = scripted([{"tool": "run", "args": {"command": BUSY}},
                       {"tool": "run", "args": {"command": "echo $PWD K=$K"}}, FINISH])
    session = trouper.start_session("t", llm=llm, runtime=server.runtime(),
                                    workspace=tmp_path / "local", command_timeout_s=3600,
                                    no_output_timeout_s=3600)
    shell = wait_until(lambda: remote_shell_of(server.proc.pid), 60, "the remote shell busy")
    session.stop()
    wait_until(lambda: ended(session), 30, "the stopped session's sandbox to end")
    assert alive(shell) == []
    [interrupted] = outcomes(session)
    assert interrupted.status == "interrupted" and "stopped" in interrupted.content
    session.resume()
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert outcomes(session)[1].content.split() == [str(server.workspace(session.id)), "K="]
    assert check_log(list(session.events())) == []
