"""What the agent changed, on a user's paths: a scripted session writes, edits and deletes
files, then ``session.diff()``, ``trouper diff`` (with and without a daemon) and ``GET
/v1/sessions/{id}/diff`` show exactly those; a repository the user keeps in the
workspace is left as it was; the route wants the token like every other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from trouper import AgentState
from trouper.testing.daemon import running_daemon
from trouper.workspace_diff.git import IDENTITY

from accel import forkserver

pytestmark = pytest.mark.slow  # runs sessions, CLI processes and a daemon

FINISH = {"tool": "finish", "args": {"message": "done"}}
WORK = [
    {"tool": "write_file", "args": {"path": "src/new.py", "content": "print('new')\n"}},
    {"tool": "edit_file", "args": {"path": "edit.txt", "old": "two", "new": "TWO"}},
    {"tool": "run", "args": {"command": "rm gone.txt && printf '\\000\\001' > blob.bin"}},
    FINISH,
]


def workspace_with_files(folder: Path) -> Path:
    folder.mkdir()
    (folder / "edit.txt").write_text("one\ntwo\n")
    (folder / "gone.txt").write_text("bye\n")
    (folder / "same.txt").write_text("untouched\n")
    return folder


def trouper_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TROUPER_HOME": str(home)}
    return forkserver.run([sys.executable, "-m", "trouper", *args], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **IDENTITY}, check=True,
                          capture_output=True, text=True).stdout


EXPECTED = [("blob.bin", "added"), ("edit.txt", "modified"), ("gone.txt", "deleted"),
            ("src/new.py", "added")]


def test_a_session_s_changes_through_the_api_and_trouper_diff(trouper, trouper_home,
                                                               scripted, tmp_path):
    _, llm = scripted(WORK)
    ws = workspace_with_files(tmp_path / "ws")
    session = trouper.start_session("change some files", llm=llm, workspace=ws)
    assert session.wait(timeout=60) == AgentState.FINISHED

    diff = session.diff()
    assert [(f.path, f.change) for f in diff.files] == EXPECTED
    assert "same.txt" not in diff.patch()
    assert next(f for f in diff.files if f.path == "blob.bin").binary

    shown = trouper_cli(trouper_home, "diff", session.id)  # no daemon: read from the home
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == diff.patch()
    assert "+++ b/src/new.py" in shown.stdout and "-two\n+TWO" in shown.stdout
    assert "binary file changed" in shown.stdout and "same.txt" not in shown.stdout
    stat = trouper_cli(trouper_home, "diff", session.id, "--stat")
    assert stat.stdout.splitlines()[-1] == "4 files changed, 2 insertions(+), 2 deletions(-)"
    assert [line.split()[:2] for line in stat.stdout.splitlines()[:-1]] == [
        ["A", "blob.bin"], ["M", "edit.txt"], ["D", "gone.txt"], ["A", "src/new.py"]]
    unknown = trouper_cli(trouper_home, "diff", "s-nosuchsession")
    assert unknown.returncode == 2 and "s-nosuchsession" in unknown.stderr


def test_a_workspace_that_is_a_git_repository_keeps_its_git_as_it_was(trouper, scripted,
                                                                       tmp_path):
    _, llm = scripted(WORK)
    ws = workspace_with_files(tmp_path / "repo")
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "edit.txt", "gone.txt")
    git(ws, "commit", "-q", "-m", "mine")
    git(ws, "add", "same.txt")  # staged, not committed: the index is the user's too
    status = git(ws, "status", "--porcelain")
    kept = {name: (ws / ".git" / name).read_bytes() for name in ("HEAD", "index")}
    refs = git(ws, "for-each-ref")
    session = trouper.start_session("change some files", llm=llm, workspace=ws)
    assert session.wait(timeout=60) == AgentState.FINISHED

    assert [(f.path, f.change) for f in session.diff().files] == EXPECTED
    assert {name: (ws / ".git" / name).read_bytes() for name in kept} == kept
    assert git(ws, "for-each-ref") == refs
    assert git(ws, "log", "--format=%s") == "mine\n"
    assert git(ws, "status", "--porcelain") != status  # the agent's changes, nothing else
    assert git(ws, "diff", "--cached", "--name-only") == "same.txt\n"


def test_a_repository_session_shows_the_agent_s_work_not_the_clone(trouper, scripted,
                                                                    tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    for name in ("README.md", "a.py", "b.py"):
        (origin / name).write_text(f"{name}\n")
    git(origin, "add", ".")
    git(origin, "commit", "-q", "-m", "first")
    _, llm = scripted([{"tool": "write_file", "args": {"path": "a.py", "content": "A\n"}},
                       FINISH])
    session = trouper.start_session("edit a.py", llm=llm, workspace=tmp_path / "ws",
                                    repo=str(origin), setup="echo built > build.log")
    assert session.wait(timeout=60) == AgentState.FINISHED
    diff = session.diff()
    assert [(f.path, f.change) for f in diff.files] == [("a.py", "modified"),
                                                        ("build.log", "added")]
    assert "cloned at" in diff.base


def test_the_daemon_s_diff_route_and_trouper_diff_through_it(scripted, tmp_path):
    _, llm = scripted(WORK)
    ws = workspace_with_files(tmp_path / "ws")
    with running_daemon(tmp_path / "home") as daemon:
        session = daemon.client().start_session("change some files", llm=llm, workspace=ws)
        assert session.wait(timeout=60) == AgentState.FINISHED
        answer = daemon.http().get(f"/v1/sessions/{session.id}/diff")
        assert answer.status_code == 200
        body = answer.json()
        assert body["available"] is True
        assert [(f["path"], f["change"]) for f in body["files"]] == EXPECTED
        assert [(f.path, f.change) for f in session.diff().files] == EXPECTED

        url = f"/v1/sessions/{session.id}/diff"
        wrong = daemon.http(token="not-the-token").get(url)
        none = httpx.get(daemon.url + url, timeout=30)  # no Authorization header at all
        for refused in (wrong, none):
            assert refused.status_code == 401 and "files" not in refused.text
        assert daemon.http().get("/v1/sessions/s-nosuch/diff").status_code == 404

        shown = trouper_cli(daemon.home.root, "diff", session.id, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout) == body


def test_start_session_leaves_a_file_holding_a_session_secret_out_of_the_baseline(
        trouper, trouper_home, scripted, tmp_path):
    from trouper.home.paths import Home
    from trouper.workspace_diff import read_baseline

    _, llm = scripted([FINISH])
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "deploy.sh").write_text("curl -H 'token: gh-secret-value-42' x\n")
    (ws / "README").write_text("hi\n")
    session = trouper.start_session("look", llm=llm, workspace=ws,
                                    secrets={"GH": "gh-secret-value-42"})
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert read_baseline(Home.at(trouper_home), session.id).with_secrets == ("deploy.sh",)
    assert session.diff().files == ()


def test_a_secret_the_agent_wrote_into_a_file_is_masked_in_the_diff(trouper, trouper_home,
                                                                    scripted, tmp_path):
    _, llm = scripted([
        {"tool": "write_file", "args": {"path": "cfg.txt", "content": "token=<secret:GH>\n"}},
        FINISH])
    session = trouper.start_session("configure", llm=llm, workspace=tmp_path / "ws",
                                    secrets={"GH": "gh-secret-value-42"})
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "ws" / "cfg.txt").read_text() == "token=gh-secret-value-42\n"
    diff = session.diff()
    assert "+token=<secret:GH>" in diff.patch() and "gh-secret-value-42" not in diff.patch()
    shown = trouper_cli(trouper_home, "diff", session.id)
    assert shown.returncode == 0, shown.stderr
    assert "+token=<secret:GH>" in shown.stdout and "gh-secret-value-42" not in shown.stdout
