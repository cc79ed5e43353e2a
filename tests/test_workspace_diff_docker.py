"""What the agent changed in a Docker session: the workspace is a host folder mounted in
the container (handed to the container's user when trouper is root), so the diff reads
it on the host as for a local session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState
from trouper.config.models import DockerRuntime

pytestmark = [pytest.mark.slow, pytest.mark.docker]

RUNTIME = DockerRuntime(image="trouper-test-busybox:latest")


@pytest.fixture(scope="module")
def trouper(trouper_home: Path, docker_homes: Callable[[Path], Path]) -> Iterator[Any]:
    from trouper import Trouper

    docker_homes(trouper_home)
    with Trouper(home=trouper_home) as t:
        yield t


def test_a_docker_session_s_changes_show_in_its_diff(trouper, scripted, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("one\ntwo\n")
    (workspace / "old.txt").write_text("old\n")
    (workspace / "same.txt").write_text("same\n")
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo made in the container > /workspace/new.txt"
                                            " && rm /workspace/old.txt"}},
        {"tool": "edit_file", "args": {"path": "notes.txt", "old": "two", "new": "TWO"}},
        {"tool": "finish", "args": {"message": "done"}},
    ])
    session = trouper.start_session("change files", llm=llm, runtime=RUNTIME,
                                    workspace=workspace)
    assert session.wait(timeout=120) == AgentState.FINISHED
    diff = session.diff()
    assert diff.available, diff.reason
    assert [(f.path, f.change) for f in diff.files] == [
        ("new.txt", "added"), ("notes.txt", "modified"), ("old.txt", "deleted")]
    assert "+made in the container" in diff.patch() and "same.txt" not in diff.patch()
