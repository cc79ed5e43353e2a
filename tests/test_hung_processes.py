"""A process that hangs (SIGSTOP here) is found by its parent's probe, killed and
restarted: a command to it is answered and carried out once, a working session carries
on, a hung broker is replaced. A busy process that answers its probes is left alone.

The probe settings are shortened (each test sets them before its Trouper opens, so every
actor process reads them); `actors/probing.py` and `actors/loop_watch.py` say when a
parent probes.
"""

from __future__ import annotations

import time

import pytest

from trouper import AgentState, Trouper
from trouper.host.processes import descendants, pid_alive, start_time
from trouper.testing import actor_pid, check_log, hang, kill, sandbox_pid, wait_until

pytestmark = pytest.mark.slow

FINISH = {"tool": "finish", "args": {"message": "done"}}
HUNG = "hung: it did not answer"


@pytest.fixture
def quick_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("UNANSWERED_PROBE_S", "0.5"), ("WORKING_PROBE_S", "0.5"),
                        ("MODEL_CALL_PROBE_S", "0.5"), ("PROBE_ANSWER_S", "1.5")):
        monkeypatch.setenv(f"TROUPER_{name}", value)


def _log(trouper: Trouper) -> str:
    return (trouper.home.root / "logs" / "trouper.log").read_text()


def test_a_command_to_a_hung_session_process_is_answered_and_carried_out_once(
        scripted, tmp_path, quick_probes):
    """Settled, so not probed until the command: the command waits, its parent probes,
    the process does not answer, it is killed, and its successor takes the command."""
    _, llm = scripted([{"say": "What next?"}, FINISH])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        with hang(session, "controller") as pid:
            session.send("go on")  # raised RequestTimeout after 30 s before
            wait_until(lambda: not pid_alive(pid), 10, "the hung process to be killed")
        assert session.wait(timeout=60) == AgentState.FINISHED
        events = list(session.events())
        said = [e.text for e in events if e.kind == "message" and e.source == "user"]
        assert said == ["t", "go on"] or said == ["go on"], said
        assert check_log(events) == []
        assert HUNG in _log(trouper)


@pytest.mark.parametrize("role", ["controller", "session", "runtime"])
def test_a_working_session_whose_process_hangs_carries_on_with_no_command(
        role, scripted, tmp_path, quick_probes):
    """No command comes; the session works (an action runs), so its parent probes it:
    the Controller, the RuntimeProxy (by its SessionSupervisor) and the supervisor (by
    the root)."""
    _hang_while_working(role, scripted, tmp_path)


def _hang_while_working(role: str, scripted, tmp_path) -> None:
    _, llm = scripted([{"tool": "run", "args": {"command": "sleep 1 && echo slept"}},
                       {"tool": "run", "args": {"command": "echo second >> ledger.txt"}},
                       FINISH])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        wait_until(lambda: any(e.kind == "action" for e in session.events()), 30,
                   "the first action to start")
        with hang(session, role) as pid:
            wait_until(lambda: not pid_alive(pid), 30, "the hung process to be killed")
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert check_log(list(session.events())) == []
        assert (tmp_path / "ws" / "ledger.txt").read_text() == "second\n"
        assert HUNG in _log(trouper)


def test_a_hung_broker_is_replaced_and_the_session_asks_the_new_one(
        scripted, tmp_path, quick_probes):
    _, llm = scripted([{"tool": "run", "args": {"command": "sleep 1"}},
                       {"say": "What next?"}, FINISH])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        wait_until(lambda: any(e.kind == "action" for e in session.events()), 30,
                   "the first action to start")
        with hang(session, "broker") as pid:  # the next model call waits for it
            wait_until(lambda: not pid_alive(pid), 30, "the hung broker to be killed")
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        session.send("go on")
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert check_log(list(session.events())) == []
        assert actor_pid(session, "broker") not in (None, pid)


def test_a_busy_process_that_answers_its_probes_is_left_alone(scripted, tmp_path,
                                                              quick_probes):
    """A slow model (3 s a call) and a long command (3 s): probed many times, the broker
    and the session's processes answer, and none is killed."""
    _, llm = scripted([{"tool": "run", "args": {"command": "sleep 3"}}, FINISH],
                      latency_s=3.0)
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        roles = ["broker", "controller", "session", "runtime"]
        pids = {role: wait_until(lambda r=role: actor_pid(session, r), 30, role)
                for role in roles}
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert {role: actor_pid(session, role) for role in roles} == pids
        log = _log(trouper)
        assert HUNG not in log
        assert "dropped" not in "\n".join(line for line in log.splitlines()
                                          if "probe" in line.lower())


def test_a_hung_sandbox_server_is_replaced_by_the_health_check(scripted, tmp_path,
                                                               monkeypatch):
    """The sandbox server is not an actor: its proxy's health check (here every 0.5 s; it
    waits 3 s for an answer) finds it hung; the action in flight is lost, not run again."""
    monkeypatch.setenv("TROUPER_SANDBOX_WATCHED_HEALTH_EVERY_S", "0.5")
    _, llm = scripted([{"tool": "run", "args": {"command": "sleep 5; echo once >> ledger.txt"}},
                       FINISH])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        wait_until(lambda: any(e.kind == "action" for e in session.events()), 30,
                   "the action to start")
        with hang(session, "sandbox") as pid:
            below = {p: start_time(p) for p in descendants([pid]) if p != pid}  # its shell
            wait_until(lambda: sandbox_pid(session) not in (None, pid), 30,
                       "a new sandbox server")
        assert session.wait(timeout=60) == AgentState.FINISHED
        events = list(session.events())
        assert check_log(events) == []
        statuses = [e.outcome.status for e in events if e.kind == "observation"]
        assert statuses[1:] == ["ok"] and statuses[0] in ("lost", "ok"), statuses  # ok: it
        ledger = tmp_path / "ws" / "ledger.txt"  # ended before the stop; never run again
        assert not ledger.exists() or ledger.read_text() == "once\n"
        assert not pid_alive(pid)
        assert below, "the server had a shell"
        left = [p for p, started in below.items() if pid_alive(p) and start_time(p) == started]
        assert left == [], "the hung server's shell or its jobs were left running"


def test_hang_names_what_it_can_stop(scripted, tmp_path):
    _, llm = scripted([{"say": "What next?"}])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        with pytest.raises(ValueError, match="unknown role"):
            with hang(session, "nobody"):
                pass
        with hang(session, "controller") as pid:  # settled: nothing probes it
            assert actor_pid(session, "controller") == pid
        session.send("go on")
        # continued when the block ended: the same process answered, none was killed
        assert actor_pid(session, "controller") == pid


def test_chaos_hangs_and_kills_leave_each_action_once_and_every_session_finished(
        scripted, tmp_path, quick_probes, monkeypatch):
    """3 sessions x 25 commands while a random process is SIGSTOPped (and waited for
    trouper to kill it) or SIGKILLed, again and again: every session finishes, `check_log`
    is clean and no command ran twice."""
    import random

    monkeypatch.setenv("TROUPER_SANDBOX_WATCHED_HEALTH_EVERY_S", "1")
    rng = random.Random(7)
    steps = [{"tool": "run", "args": {"command": f"sleep 0.{rng.randint(2, 6)}; "
                                                 f"echo s{i} >> ledger.txt"}}
             for i in range(25)]
    _, llm = scripted([*steps, FINISH])
    victims = ["controller", "broker", "sandbox", "session", "runtime"]
    found = 0
    with Trouper(home=tmp_path / "home") as trouper:
        sessions = [trouper.start_session("t", llm=llm, workspace=tmp_path / f"ws{i}")
                    for i in range(3)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            working = [s for s in sessions if not s.view().settled]
            if not working:
                break
            session, what = rng.choice(working), rng.choice(victims)
            try:
                if rng.random() < 0.5:
                    with hang(session, what, timeout_s=5) as pid:
                        wait_until(lambda p=pid: not pid_alive(p), 15, "trouper to kill it")
                    found += 1
                else:
                    kill(session, what, timeout_s=5)
            except TimeoutError:
                pass  # settled meanwhile (not probed), or nothing of that kind ran
        for i, session in enumerate(sessions):
            assert session.wait(timeout=120) == AgentState.FINISHED
            assert check_log(list(session.events())) == []
            ledger = (tmp_path / f"ws{i}" / "ledger.txt").read_text().split()
            assert len(ledger) == len(set(ledger)), ledger
    assert found >= 1  # the run did hang something that trouper found
