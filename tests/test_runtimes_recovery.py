"""The local runtime's recovery tests, on the Docker and remote runtimes too: the
Controller, the SessionSupervisor or the broker SIGKILLed mid-command, and a chaos run of
random kills over several sessions, leave every action exactly one outcome, nothing run
twice, and every session FINISHED."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState, ObservationEvent, RestartPolicy, Trouper
from trouper.config.models import DockerRuntime
from trouper.testing import check_log, kill, kill_actor, wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

FINISH = {"tool": "finish", "args": {"message": "done"}}
SLOW_LEDGER = "touch started; sleep 1.5; echo one >> ledger.txt"


@dataclass
class Backend:
    runtime: Any
    where: Callable[[Any, Path], Path]
    """``where(session, local_folder)``: the folder the session's agent really works in."""


@pytest.fixture(params=["docker", "remote"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "docker":
        request.getfixturevalue("docker_client")  # skips, or fails in CI, without an engine
        request.node.add_marker(pytest.mark.docker)
        yield Backend(DockerRuntime(image="trouper-test-busybox:latest"),
                      lambda session, local: local)
    else:
        server = request.getfixturevalue("remote_server")()
        yield Backend(server.runtime(), lambda session, local: server.workspace(session.id))


@pytest.fixture
def home(request: pytest.FixtureRequest, tmp_path: Path, backend: Backend) -> Path:
    home = tmp_path / "home"
    if isinstance(backend.runtime, DockerRuntime):
        request.getfixturevalue("docker_homes")(home)  # its containers are checked and gone
    return home


def outcomes(session: Any) -> list:
    return [e.outcome for e in session.events() if isinstance(e, ObservationEvent)]


@pytest.mark.parametrize("role", ["controller", "session", "broker"])
def test_an_actor_killed_mid_command_leaves_one_real_outcome(role, backend, home,
                                                             scripted, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": SLOW_LEDGER}},
        {"tool": "run", "args": {"command": "echo two >> ledger.txt"}},
        FINISH,
    ])
    with Trouper(home=home) as trouper:
        session = trouper.start_session("t", llm=llm, runtime=backend.runtime,
                                        workspace=tmp_path / "ws")
        workspace = backend.where(session, tmp_path / "ws")
        wait_until(lambda: (workspace / "started").exists(), 60, "the slow command to start")
        kill_actor(session, role)
        assert session.wait(timeout=120) == AgentState.FINISHED
        assert (workspace / "ledger.txt").read_text() == "one\ntwo\n"  # nothing run twice
        assert outcomes(session)[0].status == "ok"  # the real outcome, read from the journal
        assert check_log(list(session.events())) == []


def test_chaos_random_kills_on_several_sessions_every_action_once(backend, home,
                                                                  scripted, tmp_path):
    rng = random.Random(11)
    sessions_n, steps_n = 3, 12
    steps = [{"tool": "run", "args": {"command": f"sleep 0.2; echo {k} >> ledger.txt"}}
             for k in range(steps_n)]
    _, llm = scripted([*steps, FINISH])
    policy = RestartPolicy(intensity=20, period_s=60, backoff_initial_s=0.02)
    with Trouper(home=home, policy=policy) as trouper:
        sessions = [trouper.start_session("t", llm=llm, runtime=backend.runtime,
                                          workspace=tmp_path / f"ws{i}")
                    for i in range(sessions_n)]
        kills = 0
        for _ in range(20):
            running = [s for s in sessions if s.state != AgentState.FINISHED]
            if kills >= 6 or not running:
                break
            victim = rng.choice(running)
            what = rng.choice(["runtime", "controller", "session", "sandbox"])
            seen = victim.view().outcomes
            try:
                kill(victim, what, timeout_s=10)
                kills += 1
            except TimeoutError:
                continue
            wait_until(lambda v=victim, n=seen: v.view().outcomes > n
                       or v.state == AgentState.FINISHED, 60, "progress after a kill")
        assert kills >= 4
        for i, session in enumerate(sessions):
            assert session.wait(timeout=180) == AgentState.FINISHED, session.record.state_reason
            assert check_log(list(session.events())) == []
            ledger = backend.where(session, tmp_path / f"ws{i}") / "ledger.txt"
            lines = ledger.read_text().split()
            lost = [o for o in outcomes(session) if o.status == "lost"]
            # a lost command may or may not have written its line; none was written twice
            assert len(lines) == len(set(lines)) and len(lines) >= steps_n - len(lost), lines
