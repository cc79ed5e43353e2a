"""Whole sessions on the remote runtime, with real SIGKILLs: the runtime server on
127.0.0.1 in a subprocess, a scripted model, and the journal on the server's disk."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from trouper import AgentState, ObservationEvent, RuntimeEvent, StateChanged, Trouper
from trouper.testing import check_log, kill, kill_actor, kill_sandbox, wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

FINISH = {"tool": "finish", "args": {"message": "done"}}


def outcomes(session) -> list:
    return [e.outcome for e in session.events() if isinstance(e, ObservationEvent)]


def phases(session) -> list[str]:
    return [e.phase for e in session.events() if isinstance(e, RuntimeEvent)]


def states(session) -> list[AgentState]:
    return [e.state for e in session.events() if isinstance(e, StateChanged)]


@pytest.fixture
def server(remote_server, monkeypatch):
    # the fault harness puts the token back from the secrets file, not from the environment
    monkeypatch.delenv("TROUPER_RUNTIME_TOKEN", raising=False)
    return remote_server()


def test_a_session_on_the_remote_runtime_finishes(trouper, scripted, server, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo one >> ledger.txt; pwd"}},
        {"tool": "write_file", "args": {"path": "notes.txt", "content": "hi\n"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, runtime=server.runtime(),
                                    workspace=tmp_path / "local")
    assert session.wait(timeout=60) == AgentState.FINISHED
    workspace = server.workspace(session.id)
    assert (workspace / "ledger.txt").read_text() == "one\n"
    assert (workspace / "notes.txt").read_text() == "hi\n"
    first = outcomes(session)[0]
    assert (first.status, first.exit_code) == ("ok", 0)
    assert str(workspace) in first.content  # the agent works in the server's folder
    assert list((tmp_path / "local").iterdir()) == []  # the local folder is not used
    assert check_log(list(session.events())) == []


def test_runtime_proxy_killed_mid_command_reattaches_and_keeps_the_real_outcome(
        trouper, scripted, server, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "touch started; sleep 1.5; echo one >> ledger.txt"}},
        {"tool": "run", "args": {"command": "cat ledger.txt"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, runtime=server.runtime(),
                                    workspace=tmp_path / "local")
    workspace = server.workspace(session.id)
    wait_until(lambda: (workspace / "started").exists(), 30, "the slow command to start")
    kill_actor(session, "runtime")
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (workspace / "ledger.txt").read_text() == "one\n"
    first = outcomes(session)[0]
    assert (first.status, first.exit_code) == ("ok", 0)
    assert phases(session)[:3] == ["started", "failed", "attached"]
    assert check_log(list(session.events())) == []


def test_runtime_server_killed_and_restarted_mid_command(trouper, scripted, server, tmp_path):
    """Finished stays finished, the interrupted command is lost and never run again, and
    the session carries on by itself (resume_after_runtime_restart) to FINISHED."""
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo zero >> ledger.txt"}},
        {"tool": "run", "args": {"command": "touch started; (trap '' HUP; sleep 8; "
                                            "echo one >> ledger.txt)"}},
        {"tool": "run", "args": {"command": "echo two >> ledger.txt"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, runtime=server.runtime(),
                                    workspace=tmp_path / "local")
    workspace = server.workspace(session.id)
    wait_until(lambda: (workspace / "started").exists(), 30, "the slow command to start")
    server.kill()
    server.start()
    assert session.wait(timeout=90) == AgentState.FINISHED, session.record.state_reason
    assert (workspace / "ledger.txt").read_text() == "zero\ntwo\n"
    zero, slow, two = outcomes(session)[:3]
    assert (zero.status, slow.status, two.status) == ("ok", "lost", "ok")
    seen = states(session)
    assert AgentState.ERROR in seen and seen[seen.index(AgentState.ERROR) + 1] == (
        AgentState.RUNNING)
    assert "started" in phases(session)[1:]  # a new sandbox, not the old one re-attached
    assert check_log(list(session.events())) == []


def test_sandbox_killed_mid_command_is_lost_and_never_run_again(trouper, scripted, server,
                                                                tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "touch started; sleep 30; echo one >> ledger.txt"}},
        {"tool": "run", "args": {"command": "ls"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, runtime=server.runtime(),
                                    workspace=tmp_path / "local")
    workspace = server.workspace(session.id)
    wait_until(lambda: (workspace / "started").exists(), 30, "the slow command to start")
    assert isinstance(kill_sandbox(session), int)
    assert session.wait(timeout=60) == AgentState.FINISHED
    first = outcomes(session)[0]
    assert first.status == "lost" and "not run again" in first.content
    assert not (workspace / "ledger.txt").exists()
    assert check_log(list(session.events())) == []


def test_the_token_is_kept_in_the_secrets_file_only_and_survives_a_restart(
        scripted, server, tmp_path, monkeypatch):
    monkeypatch.delenv("TROUPER_RUNTIME_TOKEN", raising=False)  # it must come from the home
    home = tmp_path / "home"
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo one >> ledger.txt"}},
        {"say": "Anything else?"},
        {"tool": "run", "args": {"command": "echo two >> ledger.txt"}},
        FINISH,
    ])
    with Trouper(home=home) as trouper:
        session = trouper.start_session("t", llm=llm, runtime=server.runtime(),
                                        workspace=tmp_path / "local")
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        assert session.record.config.runtime.token is None  # the store never holds it
    with Trouper(home=home) as trouper:  # a new program: the token comes from secrets.json
        session = trouper.session(session.id)
        session.send("go on")
        assert session.wait(timeout=60) == AgentState.FINISHED, session.record.state_reason
    assert (server.workspace(session.id) / "ledger.txt").read_text() == "one\ntwo\n"
    token = server.token.encode()
    holders = sorted(str(p.relative_to(home)) for p in home.rglob("*")
                     if p.is_file() and token in p.read_bytes())
    assert holders == [f"sessions/{session.id}/secrets.json"]


def test_the_token_is_not_in_the_server_argv(remote_server):
    server = remote_server(fresh=True)  # its own argv and environment in /proc
    argv = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    assert b"runtime-server" in argv and b"--token-file" in argv
    assert server.token.encode() not in argv
    assert server.token.encode() not in Path(f"/proc/{server.proc.pid}/environ").read_bytes()


def test_without_resume_after_runtime_restart_the_session_waits_in_error(
        trouper, scripted, server, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "touch started; sleep 8; echo one >> ledger.txt"}},
        {"tool": "run", "args": {"command": "echo two >> ledger.txt"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, runtime=server.runtime(),
                                    workspace=tmp_path / "local",
                                    resume_after_runtime_restart=False)
    workspace = server.workspace(session.id)
    wait_until(lambda: (workspace / "started").exists(), 30, "the slow command to start")
    server.kill()
    server.start()
    assert session.wait(timeout=90) == AgentState.ERROR
    assert outcomes(session)[0].status == "lost"  # resolved before it waits for the user
    session.resume()
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (workspace / "ledger.txt").read_text() == "two\n"
    assert check_log(list(session.events())) == []


def test_close_cancels_a_start_waiting_for_a_server_that_does_not_answer(scripted, tmp_path):
    """A proxy waits up to ready_timeout_s for its runtime server to answer; closing the
    Trouper cancels that wait and closes the session's sandbox, instead of holding the
    shutdown until its deadline and leaving the session out."""
    import socket

    held = socket.socket()  # listening, never answering: each health request hangs until
    held.bind(("127.0.0.1", 0))  # its 5 s read timeout, then the proxy waits and asks
    held.listen(8)  # again; no other test's server can take the port meanwhile
    held.settimeout(30)
    runtime = {"kind": "remote", "url": f"http://127.0.0.1:{held.getsockname()[1]}",
               "token": "t" * 32, "ready_timeout_s": 600}
    _, llm = scripted([FINISH])
    try:
        with Trouper(home=tmp_path / "home") as t:
            session = t.start_session("t", llm=llm, runtime=runtime,
                                      workspace=tmp_path / "local")
            asking, _ = held.accept()  # the proxy's first health request: it is waiting
            with asking:
                assert b"/v1/health" in asking.recv(4096)
                assert t.close() == [session.id]
    finally:
        held.close()


def test_chaos_remote_sessions_under_random_kills_run_every_action_at_most_once(
        trouper, scripted, server, tmp_path):
    """Sessions on the remote runtime while their agent loop, their sandbox driver, their
    sandbox or the whole runtime server is SIGKILLed at random (the server started again):
    each finishes, each action has one outcome, and none ran twice."""
    import random

    rng = random.Random(3)
    sessions_n, steps_n = 3, 12
    steps = [{"tool": "run", "args": {"command": f"sleep 0.05; echo {k} >> ledger.txt"}}
             for k in range(steps_n)]
    _, llm = scripted([*steps, FINISH])
    sessions = [trouper.start_session("t", llm=llm, runtime=server.runtime(),
                                      workspace=tmp_path / f"local{i}")
                for i in range(sessions_n)]
    kills = 0
    for _ in range(10):
        victim = rng.choice(sessions)
        if victim.state == AgentState.FINISHED:
            continue
        what = rng.choice(["controller", "runtime", "sandbox", "server"])
        try:
            if what == "server":
                server.kill()
                server.start()
            else:
                kill(victim, what, timeout_s=10)
            kills += 1
        except TimeoutError:
            continue
        wait_until(lambda v=victim: v.view().outcomes > 0, 60, "progress")
    assert kills >= 5
    for session in sessions:
        assert session.wait(timeout=120) == AgentState.FINISHED, session.record.state_reason
        assert check_log(list(session.events())) == []
        ledger = server.workspace(session.id) / "ledger.txt"
        lines = ledger.read_text().split()
        assert lines == sorted(set(lines), key=int), lines  # in order, none twice
        statuses = [o.status for o in outcomes(session)[:steps_n]]  # the ledger's steps
        ok, lost = statuses.count("ok"), statuses.count("lost")
        assert ok + lost == steps_n, statuses
        assert ok <= len(lines) <= ok + lost  # a lost one may have run before its server died


def test_an_mcp_server_runs_on_the_remote_runtimes_host(trouper, scripted, server, tmp_path):
    script = (Path(__file__).resolve().parents[1] / "testing" / "mcp_server.sh").read_text()
    _, llm = scripted([{"tool": "mcp__t__echo", "args": {"text": "from afar"}}, FINISH])
    session = trouper.start_session(  # the setup writes the server (it runs before it)
        "t", llm=llm, runtime=server.runtime(), workspace=tmp_path / "local",
        setup=f"printf '%s' {shlex.quote(script)} > mcp_server.sh",
        mcp=[{"name": "t", "command": ["sh", "mcp_server.sh"]}])
    assert session.wait(timeout=60) == AgentState.FINISHED, session.info().reason
    assert [o.content for o in outcomes(session)][-2:] == ["from afar", "done"]
    calls = (server.workspace(session.id) / "mcp-calls.log").read_text().split("\n")
    assert [line.split()[1] for line in calls if line] == ["echo"]
    assert check_log(list(session.events())) == []


def test_a_fork_of_a_remote_session_gets_its_checkpoint_on_the_server(
        trouper, scripted, server, tmp_path):
    steps = [{"tool": "run", "args": {"command": "echo one > a.txt"}},
             {"tool": "run", "args": {"command": "echo two > a.txt; echo b > b.txt"}}, FINISH]
    _, llm = scripted(steps)
    session = trouper.start_session("t", llm=llm, runtime=server.runtime(),
                                    workspace=tmp_path / "local")
    assert session.wait(timeout=60) == AgentState.FINISHED
    events = list(session.events())
    first = next(e for e in events if isinstance(e, ObservationEvent))
    _, again = scripted([steps[0], {"tool": "run", "args": {"command": "cat a.txt"}},
                         FINISH])
    fork = trouper.fork(session.id, at_seq=first.seq, message="look", llm=again)
    assert fork.wait(timeout=60) == AgentState.FINISHED, fork.info().reason
    mark = next(e for e in fork.events() if e.kind == "forked")
    assert mark.checkpoint == first.outcome.checkpoint, mark.files
    assert [o.content for o in outcomes(fork)][-2] == "one\n"  # the files of event N
    forked = server.workspace(fork.id)
    assert sorted(p.name for p in forked.iterdir() if p.name != ".trouper") == ["a.txt"]
    assert (server.workspace(session.id) / "a.txt").read_text() == "two\n"  # untouched
