"""A daemon's Docker sessions: its stop route ends a session's container at once, and no
container outlives the daemon's stop but a ``keep`` one, while the sessions carry on in
fresh containers when it starts again.

Before, the daemon stopped with ``close(stop_sandboxes=False)`` and left every container
running (a killed one ``Exited``) for the next start to re-attach or for nobody.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState
from trouper.runtimes.docker_support import (
    LABEL_OWNER,
    LABEL_SESSION,
    list_containers,
    owner_of_home,
)
from trouper.testing import wait_until
from trouper.testing.daemon import running_daemon

pytestmark = [pytest.mark.slow, pytest.mark.docker]

IMAGE = "trouper-test-busybox:latest"
FINISH = {"tool": "finish", "args": {"message": "done"}}


def of_session(client: Any, session_id: str) -> list[Any]:
    return list_containers(client, [f"{LABEL_SESSION}={session_id}"])


def steps_done(workspace: Path) -> int:
    try:
        return len((workspace / "steps.txt").read_text().splitlines())
    except FileNotFoundError:
        return 0


def test_a_daemon_stop_leaves_only_kept_containers_and_its_sessions_carry_on_fresh(
        tmp_path: Path, scripted, docker_homes, docker_client):
    steps = [{"tool": "run", "args": {"command": f"echo {i} >> steps.txt; sleep 0.2"}}
             for i in range(25)]
    _, llm = scripted([*steps, FINISH])
    home = docker_homes(tmp_path / "home")
    owner = [f"{LABEL_OWNER}={owner_of_home(home)}"]
    runtime = {"kind": "docker", "image": IMAGE}
    kept_id = ""
    try:
        with running_daemon(home) as daemon:
            client = daemon.client()
            plain = client.start_session("t", llm=llm, runtime=runtime,
                                         workspace=tmp_path / "plain", max_iterations=100)
            kept = client.start_session("t", llm=llm, runtime={**runtime, "keep": True},
                                        workspace=tmp_path / "kept", max_iterations=100)
            stopped = client.start_session("t", llm=llm, runtime=runtime,
                                           workspace=tmp_path / "stopped", max_iterations=100)
            wait_until(lambda: min(steps_done(tmp_path / w) for w in ("plain", "kept",
                       "stopped")) >= 2, 120, "the three sessions to work")
            stopped.stop()  # the daemon's stop route: the container goes at once
            wait_until(lambda: of_session(docker_client, stopped.id) == [], 60,
                       "the stopped session's container to go")
            assert stopped.wait(timeout=30) == AgentState.STOPPED
            [first] = of_session(docker_client, plain.id)
            first.kill()  # docker kill under a busy run: replaced, then Exited
            before = steps_done(tmp_path / "plain")
            wait_until(lambda: steps_done(tmp_path / "plain") > before, 120,
                       "the killed session to work again")
            [kept_container] = of_session(docker_client, kept.id)
            kept_id = kept_container.id
            daemon.stop()
            assert [c.id for c in list_containers(docker_client, owner)] == [kept_id]
            daemon.start()  # the sessions carry on, the plain one in a fresh container
            client = daemon.client()
            for session in (plain, kept):
                assert client.session(session.id).wait(timeout=240) == AgentState.FINISHED
            assert [c.id for c in of_session(docker_client, plain.id)] not in ([], [first.id])
            assert [c.id for c in of_session(docker_client, kept.id)] == [kept_id]
            assert of_session(docker_client, stopped.id) == []
    finally:
        for container in list_containers(docker_client, owner):
            if container.id == kept_id:  # kept while its session exists; the test ends it
                container.remove(force=True)
    assert list_containers(docker_client, owner) == []
