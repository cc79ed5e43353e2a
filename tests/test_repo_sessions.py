"""Sessions that start from a repository: the clone and the setup script run before the
first step, as events with their output; a failure is ERROR naming the step."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from trouper import ActionEvent, AgentState, ObservationEvent, StateChanged
from trouper.runtimes.sandbox.clone import clone

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

FINISH = {"tool": "finish", "args": {"message": "done"}}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with a README and AGENTS.md on main, and feature.txt on ``feature``."""
    path = tmp_path / "origin"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("hello\n")
    (path / "AGENTS.md").write_text("Always run the tests with `make check`.\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "first")
    git(path, "checkout", "-q", "-b", "feature")
    (path / "feature.txt").write_text("on feature\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "feature")
    git(path, "checkout", "-q", "main")
    return path


def setup_events(session) -> list[tuple[str, str, str]]:
    events = list(session.events())
    steps = {e.action_id: e.tool for e in events
             if isinstance(e, ActionEvent) and e.source == "environment"}
    return [(steps[e.action_id], e.outcome.status, e.outcome.content) for e in events
            if isinstance(e, ObservationEvent) and e.action_id in steps]


def test_clone_at_a_branch_into_an_empty_folder_and_refuse_a_full_one(repo, tmp_path):
    workspace = tmp_path / "ws"
    outcome = clone(str(workspace), str(repo), "feature", 60)
    assert outcome["status"] == "ok", outcome
    assert "feature at" in outcome["content"]
    assert (workspace / "feature.txt").read_text() == "on feature\n"
    again = clone(str(workspace), str(repo), None, 60)
    assert again["status"] == "error" and "not empty" in again["content"]
    missing = clone(str(tmp_path / "other"), str(tmp_path / "no-such-repo"), None, 60)
    assert missing["status"] == "error" and missing["exit_code"] == 128


def test_a_session_from_a_repository_clones_runs_its_setup_then_works(
        trouper, scripted, repo, tmp_path):
    server, llm = scripted([{"tool": "run", "args": {"command": "cat built.txt feature.txt"}},
                            FINISH])
    workspace = tmp_path / "ws"
    session = trouper.start_session(
        "build it", llm=llm, workspace=workspace, repo=str(repo), branch="feature",
        setup="test -f README.md && echo built > built.txt && echo setup-ok")
    assert session.wait(timeout=60) == AgentState.FINISHED
    steps = setup_events(session)
    assert [(tool, status) for tool, status, _ in steps] == [("clone", "ok"), ("run", "ok")]
    assert "setup-ok" in steps[1][2]
    agent_outcome = [e.outcome for e in session.events() if isinstance(e, ObservationEvent)][2]
    assert agent_outcome.content.splitlines() == ["built", "on feature"]
    first = server.requests[0].body
    assert "make check" in first["messages"][0]["content"]  # the clone's AGENTS.md
    assert "setup-ok" in first["messages"][-1]["content"]
    assert not any(m.get("tool_calls") for m in first["messages"])


@pytest.mark.parametrize("options, named", [
    ({"setup": "echo broken >&2; exit 7"}, "the setup script (exit status 7): broken"),
    ({"repo": "/no/such/repository", "setup": "touch never"},
     "the clone of the repository (exit status 128)"),
])
def test_a_failing_setup_step_ends_in_error_naming_it(trouper, scripted, tmp_path, options,
                                                      named):
    server, llm = scripted([FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws", **options)
    assert session.wait(timeout=60) == AgentState.ERROR
    reason = [e for e in session.events() if isinstance(e, StateChanged)][-1].reason
    assert reason.startswith(f"setup failed: {named}"), reason
    assert server.requests == []  # the model was never asked
    assert not (tmp_path / "ws" / "never").exists()
