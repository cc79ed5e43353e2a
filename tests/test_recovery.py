"""Crash recovery with real SIGKILLs: no action runs twice, every action gets one outcome."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trouper import (
    ActionEvent,
    AgentState,
    MessageEvent,
    ObservationEvent,
    RestartPolicy,
    RuntimeEvent,
    StateChanged,
    Trouper,
)
from trouper.config.settings import settings
from trouper.testing import (
    actor_pid,
    check_log,
    kill,
    kill_actor,
    kill_sandbox,
    wait_until,
)

from accel import forkserver

# real processes (`-m 'not slow'` skips them)
pytestmark = pytest.mark.slow

FINISH = {"tool": "finish", "args": {"message": "done"}}
SLOW_LEDGER = "touch started; sleep 1.5; echo one >> ledger.txt"


def outcomes(session) -> list:
    return [e.outcome for e in session.events() if isinstance(e, ObservationEvent)]


def states(session) -> list[AgentState]:
    return [e.state for e in session.events() if isinstance(e, StateChanged)]


def started(workspace: Path) -> None:
    wait_until(lambda: (workspace / "started").exists(), 30, "the slow command to start")


def test_runtime_proxy_killed_mid_command_keeps_its_real_outcome(trouper, scripted, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": SLOW_LEDGER}},
        {"tool": "run", "args": {"command": "cat ledger.txt"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    started(tmp_path)
    controller = actor_pid(session, "controller")
    killed = kill_actor(session, "runtime")  # the RuntimeProxy's own process
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "ledger.txt").read_text() == "one\n"
    first = outcomes(session)[0]
    assert (first.status, first.exit_code) == ("ok", 0)
    seen = states(session)
    assert AgentState.ERROR in seen and seen[seen.index(AgentState.ERROR) + 1] == (
        AgentState.RUNNING)
    error = next(e for e in session.events()
                 if isinstance(e, StateChanged) and e.state == AgentState.ERROR)
    assert "exited" in error.reason, error.reason  # the cause, from its SessionSupervisor
    # restarted by its supervisor; the Controller was never touched
    assert actor_pid(session, "runtime") not in (None, killed)
    assert actor_pid(session, "controller") == controller
    phases = [e.phase for e in session.events() if isinstance(e, RuntimeEvent)]
    assert phases[:3] == ["started", "failed", "attached"]
    assert check_log(list(session.events())) == []


def test_sandbox_killed_mid_command_is_lost_and_never_run_again(trouper, scripted, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "touch started; sleep 30; echo one >> ledger.txt"}},
        {"tool": "run", "args": {"command": "ls"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    started(tmp_path)
    kill_sandbox(session)
    assert session.wait(timeout=60) == AgentState.FINISHED
    first = outcomes(session)[0]
    assert first.status == "lost" and "not run again" in first.content
    assert not (tmp_path / "ledger.txt").exists()
    assert check_log(list(session.events())) == []


@pytest.mark.parametrize("role", ["controller", "session"])
def test_controller_or_session_killed_mid_command_rebuilds_from_the_log(
    role, trouper, scripted, tmp_path
):

    """A new Controller (under a new SessionSupervisor, for "session") folds the log and
    asks the journal about the command in flight: its real outcome, recorded once."""
    _, llm = scripted([
        {"tool": "run", "args": {"command": SLOW_LEDGER}},
        {"tool": "run", "args": {"command": "echo two >> ledger.txt"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    started(tmp_path)
    kill_actor(session, role)
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "ledger.txt").read_text() == "one\ntwo\n"
    assert outcomes(session)[0].status == "ok"
    assert check_log(list(session.events())) == []


def test_broker_killed_mid_call_is_restarted_and_the_call_resent(trouper, scripted, tmp_path):
    server, llm = scripted([
        {"tool": "run", "args": {"command": "echo one >> ledger.txt"}},
        {"tool": "run", "args": {"command": "echo two >> ledger.txt"}, "delay_s": 2.0},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    wait_until(lambda: any(r.step == 1 for r in server.requests), 30, "the slow model call")
    kill_actor(session, "broker")
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "ledger.txt").read_text() == "one\ntwo\n"
    assert check_log(list(session.events())) == []


@pytest.mark.parametrize("role, cause", [("runtime", "the sandbox failed 3 times"),
                                         ("controller", "the agent loop failed 3 times")])
def test_past_the_restart_intensity_error_then_resume_carries_on(scripted, tmp_path,
                                                                 role, cause):
    """Past a child's restart intensity nobody drives that part of the session: it is
    recorded ERROR naming the cause, and a resume carries it on from the log (nothing run
    twice), whether the sandbox or the agent loop kept dying."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    _, llm = scripted([
        {"tool": "run", "args": {"command": "touch started; sleep 2; echo one >> ledger.txt"}},
        {"tool": "run", "args": {"command": "echo two >> ledger.txt"}},
        FINISH,
    ])
    # no cooldown rounds: past the intensity the session waits for the user (see
    # test_fault_edges.py for the rounds that come back by themselves)
    policy = RestartPolicy(intensity=2, period_s=60, backoff_initial_s=0.01, giveup_rounds=0)
    with Trouper(home=home, policy=policy) as trouper:
        session = trouper.start_session("t", llm=llm, workspace=workspace)
        started(workspace)
        for _ in range(3):
            kill_actor(session, role)
        assert session.wait(timeout=60) == AgentState.ERROR
        reason = session.record.state_reason
        assert cause in reason and "resume" in reason, reason
        session.resume()
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert check_log(list(session.events())) == []
    assert (workspace / "ledger.txt").read_text() == "one\ntwo\n"


DRIVER = textwrap.dedent("""
    import sys, time
    from trouper import Trouper
    home, url, workspace, out = sys.argv[1:5]
    t = Trouper(home=home)
    s = t.start_session("t", llm={"model": "hosted_vllm/x", "base_url": url, "api_key": "k"},
                        workspace=workspace)
    open(out, "w").write(s.id)
    time.sleep(600)
""")


def test_whole_process_tree_killed_then_reopened_carries_on(scripted, tmp_path):
    home, workspace, out = tmp_path / "home", tmp_path / "ws", tmp_path / "id.txt"
    _, llm = scripted([
        {"tool": "run", "args": {"command": SLOW_LEDGER}},
        {"tool": "run", "args": {"command": "echo two >> ledger.txt"}},
        FINISH,
    ])
    driver = forkserver.Popen(
        [sys.executable, "-c", DRIVER, str(home), llm["base_url"], str(workspace), str(out)],
        start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        started(workspace)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the program and every actor it forked
        driver.wait(timeout=30)
    session_id = out.read_text()
    with Trouper(home=home) as trouper:  # resume=True: restores what was working
        session = trouper.session(session_id)
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert (workspace / "ledger.txt").read_text() == "one\ntwo\n"
        assert outcomes(session)[0].status == "ok"
        assert check_log(list(session.events())) == []


@pytest.mark.slow
def test_chaos_many_sessions_random_kills_every_action_once(scripted, tmp_path):
    import random

    rng = random.Random(7)
    sessions_n, steps_n = 10, 20
    steps = [{"tool": "run", "args": {"command": f"sleep 0.05; echo {k} >> ledger.txt"}}
             for k in range(steps_n)]
    _, llm = scripted([*steps, FINISH])
    policy = RestartPolicy(intensity=20, period_s=60, backoff_initial_s=0.02)
    with Trouper(home=tmp_path / "home", policy=policy) as trouper:
        sessions = [trouper.start_session("t", llm=llm, workspace=tmp_path / f"ws{i}")
                    for i in range(sessions_n)]
        kills = 0
        for _ in range(16):
            victim = rng.choice(sessions)
            if victim.state == AgentState.FINISHED:
                continue
            try:
                kill_actor(victim, rng.choice(["runtime", "controller"]), timeout_s=10)
                kills += 1
            except TimeoutError:
                continue
            wait_until(lambda v=victim: v.view().outcomes > 0, 30, "progress")
        assert kills >= 8
        for session in sessions:
            assert session.wait(timeout=120) == AgentState.FINISHED, session.record.state_reason
            events = list(session.events())
            assert check_log(events) == []
    for i in range(sessions_n):
        lines = (tmp_path / f"ws{i}" / "ledger.txt").read_text().split()
        assert lines == [str(k) for k in range(steps_n)], f"session {i}: {lines}"


def test_the_sandbox_refuses_a_stale_proxy(trouper, scripted, tmp_path):
    """A replaced proxy's epoch is refused by the sandbox (promise I2, docs/promises.md)."""
    from trouper.exceptions import StaleEpoch
    from trouper.messages.actions import RunCommand
    from trouper.runtimes.sandbox_client import SandboxClient

    _, llm = scripted([{"tool": "run", "args": {"command": "echo hi"}}, FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    info = json.loads((trouper.home.runtime_dir(session.id) / "server.json").read_text())
    probe = SandboxClient("127.0.0.1", info["port"], info["token"], epoch=None)
    current = int(probe.alive()["epoch"])  # the sandbox counts epochs: 1 for the first proxy
    probe.close()
    stale = SandboxClient("127.0.0.1", info["port"], info["token"], epoch=current - 1)
    with pytest.raises(StaleEpoch):
        stale.execute("a-stale", RunCommand(command="echo no >> ledger.txt"),
                      timeout_s=5, no_output_timeout_s=5)
    assert not (tmp_path / "ledger.txt").exists()


def test_an_idle_sandbox_server_that_dies_is_replaced_through_its_exit_watch(
        scripted, tmp_path, monkeypatch):
    """With health checks an hour apart, only the proxy's wait on the server's exit (a
    pidfd Thespian selects on) can see the death: an idle session polls nothing."""
    monkeypatch.setenv("TROUPER_SANDBOX_HEALTH_EVERY_S", "3600")
    monkeypatch.setenv("TROUPER_SANDBOX_WATCHED_HEALTH_EVERY_S", "3600")
    _, llm = scripted([{"say": "Ready when you are."}, FINISH])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        killed_at = session.record.last_seq
        kill_sandbox(session)
        wait_until(lambda: [e.phase for e in session.events(since=killed_at)
                            if isinstance(e, RuntimeEvent)][:2] == ["failed", "started"],
                   30, "the exit watch to replace the sandbox")
        assert session.state == AgentState.AWAITING_USER_INPUT
        session.send("go")
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert check_log(list(session.events())) == []


def test_a_sandbox_that_dies_while_idle_is_replaced_by_the_health_check(trouper, scripted,
                                                                       tmp_path):
    _, llm = scripted([
        {"say": "Ready when you are."},
        {"tool": "run", "args": {"command": "echo after > after.txt"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
    killed_at = session.record.last_seq
    kill_sandbox(session)

    def replaced() -> bool:
        phases = [e.phase for e in session.events(since=killed_at)
                  if isinstance(e, RuntimeEvent)]
        return phases[:2] == ["failed", "started"]

    wait_until(replaced, 30, "the health check to replace the sandbox")
    assert session.state == AgentState.AWAITING_USER_INPUT  # idle: nothing to recover
    session.send("go")
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "after.txt").read_text() == "after\n"
    assert check_log(list(session.events())) == []



def test_close_stops_the_sandbox_of_a_session_whose_agent_loop_is_down(scripted,
                                                                       tmp_path):
    """In its give-up cooldown nobody drives the session (no Controller runs);
    Trouper.close() still stops its sandbox, as it does every other's."""
    from trouper.host.processes import pid_alive
    from trouper.testing import sandbox_pid

    _, llm = scripted([{"tool": "run", "args": {"command": "touch started; sleep 30"}},
                       FINISH])
    policy = RestartPolicy(intensity=0, giveup_rounds=1, giveup_cooldown_s=600)
    t = Trouper(home=tmp_path / "home", policy=policy)
    try:
        session = t.start_session("t", llm=llm, workspace=tmp_path / "ws")
        started(tmp_path / "ws")
        server = sandbox_pid(session)
        assert server is not None
        kill_actor(session, "controller")
        wait_until(lambda: session.state == AgentState.ERROR, 30, "the loop's give-up")
        assert "trying again in 300 s" in session.record.state_reason  # the cap
    finally:
        closed = t.close()
    assert closed == [session.id]
    wait_until(lambda: not pid_alive(server), 30, "the sandbox server to stop")


def _bytes_queued_to(pid: int) -> bool:
    """Whether a TCP connection to process ``pid`` holds bytes it has not read (``ss``)."""
    def ss(*args: str) -> list[str]:
        return subprocess.run(["ss", "-tnpH", *args], capture_output=True, text=True,
                              check=True).stdout.splitlines()

    ports = {line.split()[3].rsplit(":", 1)[1] for line in ss("-l") if f"pid={pid}," in line}
    for line in ss():
        fields = line.split()
        if int(fields[1]) > 0 and (f"pid={pid}," in line
                                   or fields[3].rsplit(":", 1)[1] in ports):
            return True
    return False


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to see the "
                    "command wait in the stopped process's socket")
def test_a_command_whose_taker_is_killed_before_it_answers_is_carried_out_once(
        trouper, scripted, tmp_path):
    """The agent loop's process is stopped, the user's message reaches its socket, and it
    is SIGKILLed: the restarted loop gets the message from its parent and carries it out
    (before, the program waited 30 s for an answer and the message was lost)."""
    _, llm = scripted([FINISH, FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    pid = wait_until(lambda: actor_pid(session, "controller"), 30, "the agent loop's pid")
    answer: dict[str, object] = {}

    def send() -> None:
        try:
            answer["seq"] = session.send("and again")
        except Exception as exc:  # noqa: BLE001 - the test reports it
            answer["error"] = exc

    sender = threading.Thread(target=send)
    os.kill(pid, signal.SIGSTOP)
    try:
        sender.start()
        wait_until(lambda: _bytes_queued_to(pid), 30, "the message in the stopped socket")
    finally:
        os.kill(pid, signal.SIGKILL)
    sender.join(60)
    assert isinstance(answer.get("seq"), int), answer
    assert session.wait(timeout=60) == AgentState.FINISHED
    said = [e.text for e in session.events()
            if isinstance(e, MessageEvent) and e.source == "user"]
    assert said == ["t", "and again"]
    assert check_log(list(session.events())) == []


def test_chaos_commands_sent_as_their_takers_are_killed_are_each_carried_out_once(
        scripted, tmp_path):
    """Each message is sent while the session's Controller or its supervisor is SIGKILLed
    at a random moment of the command's way: every send is answered, and the log has
    each message once, in order. (Before, a command was lost; then, with the answer sent
    beside the parent's word, an answer could be.)"""
    import random

    rng = random.Random(11)
    rounds, sessions_n = 24, 4
    _, llm = scripted([{"say": "ok?"}] * (rounds + sessions_n + 1))
    roles = ["controller", "session"]
    policy = RestartPolicy(intensity=100, period_s=60)
    with Trouper(home=tmp_path / "home", policy=policy) as trouper:
        sessions = [trouper.start_session("t", llm=llm, workspace=tmp_path / f"ws{i}")
                    for i in range(sessions_n)]
        sent: dict[str, list[str]] = {s.id: [] for s in sessions}
        stands_down, kills = settings().settled_stand_down_s < 60, 0
        for r in range(rounds):
            session = rng.choice(sessions)
            assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
            role = rng.choice(roles)
            # with a short TROUPER_SETTLED_STAND_DOWN_S the settled session may have stood
            # down: the send then restores it, and nothing is killed this round
            pid = actor_pid(session, role) if stands_down else wait_until(
                lambda s=session, role=role: actor_pid(s, role), 30, "its pid")
            kills += pid is not None
            answer: dict[str, object] = {}

            def send(s=session, text=f"m{r}", answer=answer) -> None:
                try:
                    answer["seq"] = s.send(text)
                except Exception as exc:  # noqa: BLE001 - the test reports it
                    answer["error"] = exc

            sender = threading.Thread(target=send)
            sender.start()
            time.sleep(rng.uniform(0, 0.004))  # the kill lands somewhere on the command's way
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):  # it stood down meanwhile
                    os.kill(pid, signal.SIGKILL)
            sender.join(60)
            assert isinstance(answer.get("seq"), int), (r, answer)
            sent[session.id].append(f"m{r}")
        assert stands_down or kills == rounds
        for session in sessions:
            assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
            said = [e.text for e in session.events()
                    if isinstance(e, MessageEvent) and e.source == "user"]
            assert said == ["t", *sent[session.id]]
            assert check_log(list(session.events())) == []


def test_chaos_approvals_as_things_are_killed_each_action_once_and_none_left_pending(
        scripted, tmp_path):
    """Confirmation mode: each waiting action is approved or rejected while the session's
    process, its sandbox driver or its sandbox is SIGKILLed at a random moment; then every
    session is stopped. Each action has one outcome (none left pending), no rejected one
    ran, none ran twice."""
    import random

    rng = random.Random(5)
    rounds, sessions_n = 20, 3
    _, llm = scripted([{"tool": "run", "args": {"command": f"echo a{k} >> ledger.txt"}}
                       for k in range(rounds + 10)])
    policy = RestartPolicy(intensity=100, period_s=60)
    with Trouper(home=tmp_path / "home", policy=policy) as trouper:
        sessions = [trouper.start_session("t", llm=llm, workspace=tmp_path / f"ws{i}",
                                          confirm="always") for i in range(sessions_n)]
        rejected: set[str] = set()
        for r in range(rounds):
            session = rng.choice(sessions)
            wait_until(lambda s=session: s.wait(timeout=30)
                       == AgentState.AWAITING_USER_CONFIRMATION, 60, "an action waiting")
            waiting = session.awaiting_confirmation
            assert waiting is not None
            approve = rng.random() < 0.7
            answer: dict[str, object] = {}

            def decide(s=session, a=waiting.action_id, yes=approve, answer=answer) -> None:
                try:
                    answer["seq"] = s.approve(a) if yes else s.reject("no", a)
                except Exception as exc:  # noqa: BLE001 - the test reports it
                    answer["error"] = exc

            decider = threading.Thread(target=decide)
            decider.start()
            time.sleep(rng.uniform(0, 0.006))  # the kill lands somewhere on the answer's way
            what = rng.choice(["controller", "runtime", "sandbox"])
            try:
                kill(session, what, timeout_s=2)
            except TimeoutError:
                pass  # between incarnations: nothing to kill this round
            decider.join(60)
            assert isinstance(answer.get("seq"), int), (r, answer)
            if not approve:
                rejected.add(waiting.action_id)
        for i, session in enumerate(sessions):
            session.stop()
            wait_until(lambda s=session: s.view().pending == {}, 30, "every outcome")
            events = list(session.events())
            assert check_log(events) == []
            outcomes = {e.action_id: e.outcome for e in events
                        if isinstance(e, ObservationEvent)}
            assert all(outcomes[a].status == "rejected" for a in rejected if a in outcomes)
            ledger = tmp_path / f"ws{i}" / "ledger.txt"
            lines = ledger.read_text().split() if ledger.exists() else []
            assert len(lines) == len(set(lines)), lines  # none ran twice
            said = {e.action_id: e.action.command.split()[1] for e in events
                    if isinstance(e, ActionEvent) and e.action is not None}
            assert not {said[a] for a in rejected if a in said} & set(lines)  # none ran
