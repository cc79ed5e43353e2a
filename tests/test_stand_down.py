"""A settled session stands down, and the next command restores it from its log.

A finished, waiting, stopped or paused session kept its process, its sandbox server and
its shell until ``close()``: a program running sessions in batches held every session it
ever ran (four rounds of 100: the root's descriptors 324 -> 1,224, each round slower).
After ``settled_stand_down_s`` with nothing pending it closes its sandbox and its process
goes; a command restores it, one racing the stand-down included, and nothing is lost.
"""

from __future__ import annotations

import time
from pathlib import Path

from trouper import AgentState, Trouper
from trouper.host.processes import pid_alive
from trouper.testing import check_log, wait_until
from trouper.testing.faults import actor_pid, sandbox_pid


def _run(word: str) -> dict:
    return {"tool": "run", "args": {"command": f"echo {word} >> out.txt"}}


FINISH = {"tool": "finish", "args": {"message": "done"}}


def test_a_settled_session_stands_down_and_the_next_command_restores_it(
        scripted, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TROUPER_SETTLED_STAND_DOWN_S", "0.3")
    _, llm = scripted([_run("a"), FINISH, _run("b"), FINISH])
    workspace = tmp_path / "ws"
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("write a", llm=llm, workspace=workspace)
        assert session.wait(timeout=60) == AgentState.FINISHED
        host, server = actor_pid(session, "controller"), sandbox_pid(session)
        assert host is not None and server is not None
        wait_until(lambda: not pid_alive(host) and not pid_alive(server), 30,
                   "the settled session's process and sandbox to go")
        assert session.state == AgentState.FINISHED  # its log is as it was
        session.send("now write b")  # restores it first
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert (workspace / "out.txt").read_text().split() == ["a", "b"]
        assert check_log(list(session.events())) == []
        assert actor_pid(session, "controller") not in (None, host)


def test_commands_racing_the_stand_down_are_all_carried_out(scripted, tmp_path: Path,
                                                             monkeypatch):
    """Each session is sent its next task as it settles, about when it stands down."""
    monkeypatch.setenv("TROUPER_SETTLED_STAND_DOWN_S", "0.05")
    rounds, count = 4, 6
    steps = []
    for r in range(rounds):
        steps += [_run(str(r)), FINISH]
    _, llm = scripted(steps)
    with Trouper(home=tmp_path / "home") as t:
        sessions = [t.start_session("write 0", llm=llm, workspace=tmp_path / f"w{i}")
                    for i in range(count)]
        assert all(s.wait(timeout=60) == AgentState.FINISHED for s in sessions)
        first_hosts = [actor_pid(s, "controller") for s in sessions]
        for r in range(1, rounds):
            for i, session in enumerate(sessions):
                assert session.wait(timeout=60) == AgentState.FINISHED
                # the test's input, not a wait: the i-th user answers 50 x i ms after the
                # last, so some answer before the stand-down, some during, some after it
                time.sleep(0.05 if r == 1 and i else 0)
                session.send(f"write {r}")
        for i, session in enumerate(sessions):
            assert session.wait(timeout=60) == AgentState.FINISHED
            lines = (tmp_path / f"w{i}" / "out.txt").read_text().split()
            assert lines == [str(r) for r in range(rounds)], (i, lines)
            assert check_log(list(session.events())) == []
        # a session whose process changed stood down and was restored (nothing is killed)
        assert [actor_pid(s, "controller") for s in sessions] != first_hosts
