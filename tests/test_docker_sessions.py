"""Whole sessions on the Docker runtime (busybox image, scripted model): to FINISHED,
through a killed RuntimeProxy (same container, real outcome), a killed container (a new
one, the action lost, the workspace intact) and a container that cannot start (ERROR
naming the cause)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState, ObservationEvent, RestartPolicy, RuntimeEvent, StateChanged
from trouper.config.models import DockerRuntime
from trouper.runtimes.docker_support import LABEL_SESSION, list_containers
from trouper.testing import check_log, kill_actor, kill_sandbox, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.docker]

RUNTIME = DockerRuntime(image="trouper-test-busybox:latest")
FINISH = {"tool": "finish", "args": {"message": "done"}}
SLOW_LEDGER = "touch started; sleep 1.5; echo one >> ledger.txt"


@pytest.fixture(scope="module")
def trouper(trouper_home: Path, docker_homes: Callable[[Path], Path]) -> Iterator[Any]:
    from trouper import Trouper

    docker_homes(trouper_home)
    with Trouper(home=trouper_home) as t:
        yield t


def outcomes(session: Any) -> list:
    return [e.outcome for e in session.events() if isinstance(e, ObservationEvent)]


def containers(client: Any, session: Any) -> list[str]:
    return [c.id for c in list_containers(client, [f"{LABEL_SESSION}={session.id}"])]


def started(workspace: Path) -> None:
    wait_until(lambda: (workspace / "started").exists(), 60, "the slow command to start")


def test_a_session_runs_to_finished_in_a_container(trouper, scripted, tmp_path,
                                                   docker_client):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "cd /tmp && export K=v"}},
        {"tool": "run", "args": {"command": "echo $PWD $K; id -u > /workspace/uid"}},
        {"tool": "write_file", "args": {"path": "/workspace/note.txt", "content": "hi\n"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, runtime=RUNTIME, workspace=tmp_path)
    assert session.wait(timeout=120) == AgentState.FINISHED
    got = outcomes(session)
    assert [o.status for o in got][:3] == ["ok", "ok", "ok"]
    assert got[1].content.split() == ["/tmp", "v"]
    assert (tmp_path / "note.txt").read_text() == "hi\n"
    assert (tmp_path / "uid").stat().st_uid == (tmp_path / "note.txt").stat().st_uid
    assert len(containers(docker_client, session)) == 1
    runtime = [e for e in session.events() if isinstance(e, RuntimeEvent)]
    phases = [e.phase for e in runtime if e.phase != "starting"]
    assert phases[0] == "started"
    steps = [e.detail.split(":")[0] for e in runtime if e.phase == "starting"]
    assert {"image", "create", "start"} <= set(steps), steps  # no silent wait at the start
    assert check_log(list(session.events())) == []


def test_a_killed_proxy_reattaches_the_same_container_and_keeps_the_outcome(
        trouper, scripted, tmp_path, docker_client):
    _, llm = scripted([
        {"tool": "run", "args": {"command": SLOW_LEDGER}},
        {"tool": "run", "args": {"command": "cat ledger.txt"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, runtime=RUNTIME, workspace=tmp_path)
    started(tmp_path)
    before = containers(docker_client, session)
    kill_actor(session, "runtime")
    assert session.wait(timeout=120) == AgentState.FINISHED
    assert containers(docker_client, session) == before and len(before) == 1
    assert (tmp_path / "ledger.txt").read_text() == "one\n"
    first = outcomes(session)[0]
    assert (first.status, first.exit_code) == ("ok", 0)
    phases = [e.phase for e in session.events()
              if isinstance(e, RuntimeEvent) and e.phase != "starting"]
    assert phases[:3] == ["started", "failed", "attached"]
    assert check_log(list(session.events())) == []


def test_a_killed_container_is_replaced_and_its_action_lost(trouper, scripted, tmp_path,
                                                            docker_client):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo kept > kept.txt"}},
        {"tool": "run", "args": {"command": "touch started; sleep 30; echo one >> ledger.txt"}},
        {"tool": "run", "args": {"command": "cat kept.txt"}},
        FINISH,
    ])
    session = trouper.start_session("t", llm=llm, runtime=RUNTIME, workspace=tmp_path)
    started(tmp_path)
    before = containers(docker_client, session)
    killed = kill_sandbox(session)
    assert killed == before[0]
    assert session.wait(timeout=120) == AgentState.FINISHED
    after = containers(docker_client, session)
    assert len(after) == 1 and after != before
    got = outcomes(session)
    assert got[1].status == "lost" and "not run again" in got[1].content
    assert got[2].status == "ok" and got[2].content.strip() == "kept"
    assert not (tmp_path / "ledger.txt").exists()
    failed = [e for e in session.events() if isinstance(e, RuntimeEvent) and e.phase == "failed"]
    assert failed and "exit code 137" in failed[0].detail
    assert check_log(list(session.events())) == []


def test_a_container_that_cannot_start_gives_error_with_the_cause(scripted, tmp_path,
                                                                  docker_homes, docker_client):
    from trouper import Trouper

    _, llm = scripted([FINISH])
    home = docker_homes(tmp_path / "home")
    policy = RestartPolicy(intensity=1, period_s=60, backoff_initial_s=0.01, giveup_rounds=0)
    with Trouper(home=home, policy=policy) as trouper:
        session = trouper.start_session(
            "t", llm=llm, runtime=DockerRuntime(image=RUNTIME.image, pids_limit=1),
            workspace=tmp_path / "ws")
        wait_until(lambda: any(isinstance(e, StateChanged) and e.state == AgentState.ERROR
                               for e in session.events()), 60, "the session to be in ERROR")
        errors = [e.reason for e in session.events()
                  if isinstance(e, StateChanged) and e.state == AgentState.ERROR]
        assert "start_failed" in errors[0] and "exit code 1" in errors[0], errors[0]
        # the container's log says why: usually the shell's "fork failed"; now and then a
        # helper's "runtime/cgo: pthread_create failed", whose crash dump fills the quoted
        # tail: that line is then quoted from earlier in the log
        assert "its log ends with" in errors[0], errors[0]
        assert "fork failed" in errors[0] or "pthread_create failed" in errors[0], errors[0]
        session.stop()
        assert session.wait(timeout=60) == AgentState.STOPPED
        # every failed start removed what it created: nothing is left for nobody to stop
        assert containers(docker_client, session) == []


def test_a_repository_session_clones_on_the_host_and_sets_up_in_the_container(
        trouper, scripted, tmp_path):
    import os
    import subprocess

    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "app.sh").write_text("echo app\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", *args], cwd=origin, env=env, check=True)
    _, llm = scripted([{"tool": "run", "args": {"command": "sh app.sh; cat ready"}}, FINISH])
    workspace = tmp_path / "ws"
    # the busybox image has no git: the clone runs where the sandbox server runs (the host)
    session = trouper.start_session("t", llm=llm, runtime=RUNTIME, workspace=workspace,
                                    repo=str(origin), setup="pwd > ready")
    assert session.wait(timeout=120) == AgentState.FINISHED
    assert outcomes(session)[2].content.split() == ["app", "/workspace"]

    _, llm = scripted([FINISH])
    failing = trouper.start_session("t", llm=llm, runtime=RUNTIME, workspace=tmp_path / "w2",
                                    setup="echo no-such-tool >&2; exit 9")
    assert failing.wait(timeout=120) == AgentState.ERROR
    reason = [e for e in failing.events() if isinstance(e, StateChanged)][-1].reason
    assert reason == "setup failed: the setup script (exit status 9): no-such-tool"
