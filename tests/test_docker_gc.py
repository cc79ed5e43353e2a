"""Containers of ended sessions are removed: by a Trouper as it starts, and by
``trouper runtime gc``; never one it did not label."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from trouper import AgentState, Trouper
from trouper.cli.main import main
from trouper.config.models import DockerRuntime
from trouper.runtimes.docker_support import (
    LABEL_OWNER,
    LABEL_SESSION,
    list_containers,
    owner_of_home,
)

pytestmark = [pytest.mark.slow, pytest.mark.docker]

IMAGE = "trouper-test-busybox:latest"


def labelled(client, home: Path, session_id: str):
    return client.containers.create(IMAGE, ["sh", "-c", "read _"], labels={
        LABEL_SESSION: session_id, LABEL_OWNER: owner_of_home(home)})


def ids(client) -> set[str]:
    return {row["Id"] for row in client.api.containers(all=True)}


def test_a_trouper_starting_removes_the_containers_of_ended_sessions(
        scripted, tmp_path, docker_client, docker_homes):
    home = docker_homes(tmp_path / "home")
    _, llm = scripted([{"tool": "run", "args": {"command": "true"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    stranger = docker_client.containers.create(IMAGE, ["sh", "-c", "read _"])
    try:
        trouper = Trouper(home=home)
        try:
            session = trouper.start_session("t", llm=llm, runtime=DockerRuntime(image=IMAGE),
                                            workspace=tmp_path / "ws")
            assert session.wait(timeout=120) == AgentState.FINISHED
        finally:
            trouper.close(stop_sandboxes=False)  # its containers go with the program
        assert list_containers(docker_client, [f"{LABEL_SESSION}={session.id}"]) == []
        left = labelled(docker_client, home, session.id)  # as a program killed outright left
        orphan = labelled(docker_client, home, "s-not-in-the-store")
        with Trouper(home=home):
            assert left.id not in ids(docker_client)
            assert orphan.id not in ids(docker_client)
            assert stranger.id in ids(docker_client)
    finally:
        stranger.remove(force=True)


def test_trouper_runtime_gc_removes_only_its_own_ended_sessions_containers(
        tmp_path, docker_client, docker_homes):
    home = docker_homes(tmp_path / "home")
    orphan = labelled(docker_client, home, "s-gone")
    other_home = labelled(docker_client, tmp_path / "elsewhere", "s-gone")
    try:
        result = CliRunner().invoke(main, ["runtime", "gc", "--home", str(home)])
        assert result.exit_code == 0, result.output
        assert "1 container(s) removed" in result.output and orphan.name in result.output
        assert orphan.id not in ids(docker_client) and other_home.id in ids(docker_client)
    finally:
        other_home.remove(force=True)
