"""Docker: a stopped session's container is removed at once, and no container a program
made outlives its close, however its containers died.

Before: ``Session.stop()`` left the container running (with the agent's background jobs)
until the session stood down ten minutes later; and a container
killed while its session worked was left ``Exited`` after the program's close whenever
the session's RuntimeProxy was down at that moment (restarting, or given up on after
repeated kills): the SessionSupervisor answered the shutdown without closing anything.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState, ObservationEvent, RestartPolicy, RuntimeEvent, StateChanged
from trouper.config.models import DockerRuntime
from trouper.runtimes.docker_support import (
    LABEL_OWNER,
    LABEL_SESSION,
    list_containers,
    owner_of_home,
)
from trouper.testing import check_log, kill, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.docker]

RUNTIME = DockerRuntime(image="trouper-test-busybox:latest")
FINISH = {"tool": "finish", "args": {"message": "done"}}


@pytest.fixture(scope="module")
def trouper(trouper_home: Path, docker_homes: Callable[[Path], Path]
            ) -> Iterator[Any]:
    from trouper import Trouper

    docker_homes(trouper_home)
    with Trouper(home=trouper_home) as t:
        yield t


def of_session(client: Any, session: Any) -> list[Any]:
    return list_containers(client, [f"{LABEL_SESSION}={session.id}"])


def of_home(client: Any, home: Path) -> list[str]:
    """``docker ps -a --filter label=trouper.owner=<owner>``: names and states."""
    return [f"{c.name} ({c.status})"
            for c in list_containers(client, [f"{LABEL_OWNER}={owner_of_home(home)}"])]


def ended(session: Any) -> bool:
    return any(isinstance(e, RuntimeEvent) and e.phase == "closed" for e in session.events())


def outcomes(session: Any) -> list:
    return [e.outcome for e in session.events() if isinstance(e, ObservationEvent)]


def test_stop_removes_the_container_at_once_and_resume_starts_a_fresh_one(
        trouper, scripted, tmp_path: Path, docker_client):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "touch started; sleep 1000 & sleep 1000"}},
        {"tool": "run", "args": {"command": "echo fresh"}}, FINISH])
    session = trouper.start_session("t", llm=llm, runtime=RUNTIME, workspace=tmp_path,
                                    command_timeout_s=3600, no_output_timeout_s=3600)
    wait_until(lambda: (tmp_path / "started").exists(), 120, "the command to run")
    [before] = [c.id for c in of_session(docker_client, session)]
    session.stop()
    wait_until(lambda: ended(session), 60, "the stopped session's sandbox to end")
    assert of_session(docker_client, session) == []  # its jobs died with it
    [interrupted] = outcomes(session)
    assert interrupted.status == "interrupted" and "stopped" in interrupted.content
    assert check_log(list(session.events())) == []
    session.resume()
    assert session.wait(timeout=120) == AgentState.FINISHED
    assert [c.id for c in of_session(docker_client, session)] not in ([], [before])
    assert outcomes(session)[1].content.strip() == "fresh"
    assert check_log(list(session.events())) == []


def steps_done(workspace: Path) -> int:
    """The steps a session has done (each appends a line)."""
    try:
        return len((workspace / "steps.txt").read_text().splitlines())
    except FileNotFoundError:
        return 0


def gave_up(session: Any) -> bool:
    """Past its restart intensity: ERROR until a long cooldown ends (no proxy, no driver)."""
    return any(isinstance(e, StateChanged) and e.state == AgentState.ERROR
               and e.reason.startswith("the sandbox failed") for e in session.events())


def test_no_container_outlives_the_close_after_containers_are_killed_at_random(
        scripted, tmp_path: Path, docker_homes, docker_client):
    """Two of three busy sessions get their container killed, each at a random moment of
    its work; with no restart allowed (``intensity=0``) each waits out a cooldown with no
    live proxy and its ``Exited`` container, while the third
    works on. The program closes: none of its containers is left, and the sessions carry
    on in fresh ones when it opens again."""
    from trouper import Trouper

    steps = [{"tool": "run", "args": {"command": f"echo {i} >> steps.txt; sleep 0.{i % 4}"}}
             for i in range(30)]
    _, llm = scripted([*steps, FINISH])
    home = docker_homes(tmp_path / "home")
    policy = RestartPolicy(intensity=0, giveup_cooldown_s=600)
    rng = random.Random()
    with Trouper(home=home, policy=policy) as t:
        sessions = [t.start_session("t", llm=llm, runtime=RUNTIME, workspace=tmp_path / f"w{i}",
                                    max_iterations=100) for i in range(3)]
        for victim in rng.sample(range(3), 2):
            at_step = rng.randint(1, 8)  # a moment of its work: killed mid-step or between
            wait_until(lambda v=victim, n=at_step: steps_done(tmp_path / f"w{v}") >= n, 120,
                       "the session to work")
            kill(sessions[victim], "sandbox", timeout_s=120)
            wait_until(lambda v=victim: gave_up(sessions[v]), 120, "its sandbox given up")
        left = of_home(docker_client, home)
        assert sum("exited" in c for c in left) == 2 and sum("running" in c for c in left) == 1
    assert of_home(docker_client, home) == []  # Exited and running ones alike
    # they carry on in fresh containers (restarts allowed again)
    with Trouper(home=home) as t:
        for session in sessions:
            assert t.session(session.id).wait(timeout=240) == AgentState.FINISHED
            assert check_log(list(t.session(session.id).events())) == []
    assert of_home(docker_client, home) == []
