"""The root actor has no supervisor in the tree: the program is its supervisor
(``root_watch.py``). A root that dies is replaced and the working sessions carry on; a
request waiting on it is asked of the new one; a hung root is killed once a request to
it times out and it does not answer a probe."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from trouper import AgentState, Trouper
from trouper.exceptions import RequestTimeout
from trouper.host.processes import pid_alive
from trouper.testing import actor_pid, check_log, hang, wait_until

pytestmark = pytest.mark.slow

FINISH = {"tool": "finish", "args": {"message": "done"}}


def test_a_root_that_dies_is_started_again_and_the_sessions_carry_on(scripted,
                                                                     tmp_path, caplog):
    _, llm = scripted([{"tool": "run", "args": {"command": "sleep 1; echo once >> l.txt"}},
                       {"say": "What next?"}, FINISH])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        wait_until(lambda: any(e.kind == "action" for e in session.events()), 30,
                   "the action to start")
        root = actor_pid(session, "root")
        os.kill(root, signal.SIGKILL)  # as the OOM killer would
        # nobody asks anything: the program's watch starts a new root, which resumes it
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        assert actor_pid(session, "root") not in (None, root)
        session.send("go on")
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert check_log(list(session.events())) == []
        assert (tmp_path / "ws" / "l.txt").read_text() == "once\n"
        assert "is gone; starting a new one" in caplog.text  # the program's own log


def test_a_command_waiting_on_a_root_that_dies_is_asked_of_the_next(scripted,
                                                                     tmp_path):
    """The command reaches a hung root; the root is then killed: the waiting request is
    asked of the new root under its id, and carried out once."""
    _, llm = scripted([{"say": "What next?"}, FINISH])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        done: list[object] = []
        with hang(session, "root") as root:
            sender = threading.Thread(target=lambda: done.append(session.send("go on")))
            sender.start()
            wait_until(lambda: trouper._system._lock.locked(), 10,  # noqa: SLF001
                       "the command to wait on the hung root")
            os.kill(root, signal.SIGKILL)
            sender.join(60)
        assert done and isinstance(done[0], int), done  # the seq: answered, not an error
        assert session.wait(timeout=60) == AgentState.FINISHED
        said = [e.text for e in session.events() if e.kind == "message" and e.source == "user"]
        assert said.count("go on") == 1
        assert check_log(list(session.events())) == []


def test_a_hung_root_is_killed_once_a_request_to_it_times_out(scripted, tmp_path,
                                                               monkeypatch, caplog):
    monkeypatch.setenv("TROUPER_PROBE_ANSWER_S", "1")
    _, llm = scripted([{"say": "What next?"}, FINISH])
    with Trouper(home=tmp_path / "home", ask_timeout_s=2) as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        with hang(session, "root") as root:
            with pytest.raises(RequestTimeout):
                trouper.command(session.id, "send", "go on", request_id="r-1")
            wait_until(lambda: not pid_alive(root), 10, "the hung root to be killed")
        assert "answers nothing, not even a probe: hung" in caplog.text
        wait_until(lambda: actor_pid(session, "root") not in (None, root), 30, "a new root")
        # sent again under its id: carried out once, whether the hung root took it or not
        trouper.command(session.id, "send", "go on", request_id="r-1")
        assert session.wait(timeout=60) == AgentState.FINISHED
        said = [e.text for e in session.events() if e.kind == "message" and e.source == "user"]
        assert said.count("go on") == 1
        assert check_log(list(session.events())) == []


def test_wait_keeps_to_its_timeout_while_the_root_hangs(scripted, tmp_path, caplog):
    """`wait()` asks the tree about storage faults: within what is left of its own timeout,
    not the 30 s a request may take (and a short wait unanswered probes nothing)."""
    _, llm = scripted([{"say": "What next?"}, FINISH])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        with hang(session, "root") as root:
            assert session.wait(timeout=1) == AgentState.AWAITING_USER_INPUT
        # asked for 30 s, its question would have ended in a probe and the root killed
        assert "not even a probe" not in caplog.text
        session.send("go on")  # the same root, continued, answers
        assert actor_pid(session, "root") == root
