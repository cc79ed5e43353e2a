"""The workspace diff without an actor system: a baseline taken, files changed by hand,
the comparison read back. What it shows, what it leaves out (and says so), and what it
never touches (the workspace, a repository of the user's)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trouper.config.models import SessionConfig
from trouper.config.settings import Settings
from trouper.home.paths import Home, private_dir
from trouper.workspace_diff import read_baseline, take_baseline, workspace_diff
from trouper.workspace_diff.baseline import BASELINE_RECORD
from trouper.workspace_diff.git import IDENTITY

LLM = {"model": "hosted_vllm/x"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **IDENTITY}, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home.at(tmp_path / "home")


def started(home: Home, workspace: Path, session_id: str = "s-1", limits: Settings | None = None,
            **config: object) -> SessionConfig:
    """A session's config, its folder and its baseline, as ``start_session`` makes them."""
    made = SessionConfig(task="t", llm=LLM, workspace=str(workspace), **config)
    private_dir(home.session_dir(session_id))
    take_baseline(home, session_id, made, limits or Settings())
    return made


def tree_digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder``: its content's hash, mode and mtime."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            info = path.stat()
            out[str(path.relative_to(folder))] = (
                f"{hashlib.sha256(path.read_bytes()).hexdigest()} {info.st_mode:o} "
                f"{info.st_mtime_ns}")
    return out


def test_new_changed_and_deleted_files_show_and_untouched_ones_do_not(home, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "same.txt").write_text("untouched\n")
    (ws / "edit.txt").write_text("one\ntwo\n")
    (ws / "gone.txt").write_text("bye\n")
    (ws / "pic.bin").write_bytes(b"\0\1\2")
    config = started(home, ws)
    (ws / "edit.txt").write_text("one\nTWO\n")
    (ws / "gone.txt").unlink()
    (ws / "dir").mkdir()
    (ws / "dir" / "new file.txt").write_text("hello\n")
    (ws / "pic.bin").write_bytes(b"\0\1\3")

    diff = workspace_diff(home, "s-1", config)
    assert diff.available, diff.reason
    assert [(f.path, f.change) for f in diff.files] == [
        ("dir/new file.txt", "added"), ("edit.txt", "modified"), ("gone.txt", "deleted"),
        ("pic.bin", "modified")]
    edit = diff.files[1]
    assert (edit.added_lines, edit.removed_lines) == (1, 1)
    assert "-two\n+TWO\n" in edit.patch and edit.patch.startswith("diff --git a/edit.txt")
    assert diff.files[3].binary and "binary file changed" in diff.files[3].patch
    assert "+hello" in diff.files[0].patch and "-bye" in diff.files[2].patch
    assert "same.txt" not in diff.patch() and "same.txt" not in diff.stat()
    assert diff.stat().splitlines()[-1] == "4 files changed, 2 insertions(+), 2 deletions(-)"
    # the patch is one git can apply: the baseline plus it is the workspace now
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, text in (("same.txt", "untouched\n"), ("edit.txt", "one\ntwo\n"),
                       ("gone.txt", "bye\n")):
        (copy / name).write_text(text)
    text_only = "".join(f.patch for f in diff.files if not f.binary)
    subprocess.run(["git", "apply"], cwd=copy, input=text_only, text=True, check=True)
    assert (copy / "edit.txt").read_text() == "one\nTWO\n" and not (copy / "gone.txt").exists()
    assert (copy / "dir" / "new file.txt").read_text() == "hello\n"


def test_nothing_changed_is_an_empty_diff_and_the_baseline_is_owner_only(home, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    config = started(home, ws)
    before = tree_digest(ws)
    diff = workspace_diff(home, "s-1", config)
    assert diff.available and diff.files == () and diff.patch() == ""
    assert diff.stat() == "no changes\n"
    assert tree_digest(ws) == before  # a diff writes nothing in the workspace
    session = home.session_dir("s-1")
    loose = [str(p) for p in session.rglob("*") if p.stat().st_mode & 0o077]
    assert loose == []
    assert [p.name for p in session.iterdir() if p.name.startswith(".diff-index")] == []


def test_large_ignored_and_nested_repository_files_are_left_out_and_said(home, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".gitignore").write_text("*.log\n")
    (ws / "run.log").write_text("log\n")
    (ws / "big.bin").write_bytes(b"x" * 5000)
    (ws / "small.txt").write_text("small\n")
    (ws / "vendored").mkdir()
    git(ws / "vendored", "init", "-q")
    limits = Settings(diff_max_file_bytes=4096)
    config = started(home, ws, limits=limits)
    (ws / "run.log").write_text("more log\n")
    (ws / "big.bin").write_bytes(b"y" * 5000)
    (ws / "huge.bin").write_bytes(b"z" * 9000)
    (ws / "small.txt").write_text("grown " * 1000)
    (ws / "vendored" / "x.txt").write_text("x\n")

    diff = workspace_diff(home, "s-1", config, limits)
    assert [(f.path, f.change, f.left_out) for f in diff.files] == [
        ("huge.bin", "added", "larger than 4 KiB"),
        ("small.txt", "modified", "larger than 4 KiB")]
    assert all(f.patch == "" for f in diff.files) and diff.patch() == ""
    notes = "\n".join(diff.notes)
    assert "ignored paths are not compared (.gitignore): run.log" in notes
    assert "larger than 4 KiB when the session started are not compared: big.bin" in notes
    assert "repositories inside the workspace are not compared: vendored/" in notes


def test_a_workspace_past_the_limits_gets_no_baseline_and_its_diff_says_why(home, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for n in range(4):
        (ws / f"f{n}.txt").write_text(f"{n}\n")
    config = started(home, ws, limits=Settings(diff_max_files=3))
    diff = workspace_diff(home, "s-1", config)
    assert not diff.available and diff.files == ()
    assert "4 files, more than TROUPER_DIFF_MAX_FILES=3" in diff.reason


def test_a_git_repository_in_the_workspace_is_read_never_written(home, tmp_path):
    ws = tmp_path / "repo"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    (ws / "tracked.txt").write_text("v1\n")
    (ws / "staged.txt").write_text("staged\n")
    git(ws, "add", "tracked.txt")
    git(ws, "commit", "-q", "-m", "first")
    git(ws, "add", "staged.txt")  # an index that differs from HEAD
    (ws / ".git" / "info" / "exclude").write_text("secret-notes.txt\n")
    (ws / "secret-notes.txt").write_text("mine\n")
    status_before = git(ws, "status", "--porcelain")  # (git status itself may write the index)
    before = tree_digest(ws / ".git")

    config = started(home, ws)
    (ws / "tracked.txt").write_text("v2\n")
    (ws / "secret-notes.txt").write_text("still mine\n")
    diff = workspace_diff(home, "s-1", config)

    assert [(f.path, f.change) for f in diff.files] == [("tracked.txt", "modified")]
    assert ".git" not in diff.patch()
    assert tree_digest(ws / ".git") == before  # HEAD, index, refs, objects: all as they were
    assert git(ws, "status", "--porcelain") != status_before  # only the user's own change
    assert git(ws, "rev-parse", "HEAD").strip() == git(ws, "rev-parse", "main").strip()


def test_a_cloned_repository_is_compared_with_the_commit_it_was_cloned_at(home, tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    (origin / "README.md").write_text("hello\n")
    (origin / "src.py").write_text("print(1)\n")
    git(origin, "add", ".")
    git(origin, "commit", "-q", "-m", "first")
    ws = tmp_path / "ws"
    ws.mkdir()
    config = started(home, ws, repo=str(origin))
    assert read_baseline(home, "s-1").kind == "clone"
    early = workspace_diff(home, "s-1", config)
    assert not early.available and "no cloned repository" in early.reason

    git(ws, "clone", "-q", str(origin), ".")  # what the session's setup step does
    (ws / "src.py").write_text("print(2)\n")
    (ws / "notes.md").write_text("new\n")
    git(ws, "commit", "-q", "-am", "the agent commits")  # the base stays the clone's commit
    diff = workspace_diff(home, "s-1", config)
    assert diff.available, diff.reason
    assert [(f.path, f.change) for f in diff.files] == [("notes.md", "added"),
                                                        ("src.py", "modified")]
    assert "cloned at" in diff.base


def test_no_diff_without_a_baseline_or_for_a_remote_workspace(home, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    old = SessionConfig(task="t", llm=LLM, workspace=str(ws))
    diff = workspace_diff(home, "s-old", old)
    assert not diff.available and "no baseline" in diff.reason
    remote = started(home, ws, "s-remote",
                     runtime={"kind": "remote", "url": "http://127.0.0.1:9", "token": "t"})
    assert read_baseline(home, "s-remote").kind == "none"
    said = workspace_diff(home, "s-remote", remote)
    assert not said.available and "runtime server's machine" in said.reason


def test_an_empty_workspace_s_baseline_runs_no_git_and_its_diff_shows_every_file(
        home, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    config = started(home, ws)
    assert read_baseline(home, "s-1").kind == "empty"
    assert not (home.session_dir("s-1") / "baseline.git").exists()  # nothing to copy
    (ws / "made.txt").write_text("made\n")
    diff = workspace_diff(home, "s-1", config)
    assert [(f.path, f.change, f.added_lines) for f in diff.files] == [("made.txt", "added", 1)]


def test_without_git_the_baseline_and_the_diff_say_to_install_it(home, tmp_path, monkeypatch):
    import trouper.workspace_diff.baseline as baseline_module
    import trouper.workspace_diff.compare as compare_module

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    monkeypatch.setattr(baseline_module, "find_git", lambda: None)
    config = started(home, ws)
    record = (home.session_dir("s-1") / BASELINE_RECORD).read_text()
    assert '"kind":"none"' in record and "git is not installed" in record
    diff = workspace_diff(home, "s-1", config)
    assert not diff.available and "install it" in diff.reason
    assert read_baseline(home, "s-1").taken_at <= datetime.now(UTC)
    monkeypatch.undo()
    config = started(home, ws, "s-2")  # a baseline taken; git gone before the diff
    monkeypatch.setattr(compare_module, "find_git", lambda: None)
    later = workspace_diff(home, "s-2", config)
    assert not later.available and "git is not installed" in later.reason


def test_a_diff_longer_than_the_cap_lists_the_rest_without_their_patches(home, tmp_path,
                                                                         monkeypatch):
    import trouper.workspace_diff.compare as compare_module

    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text("".join(f"line {n}\n" for n in range(100)))
    config = started(home, ws)
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text("".join(f"changed {n}\n" for n in range(100)))
    monkeypatch.setattr(compare_module, "MAX_PATCH_BYTES", 3000)  # a.txt's patch fits
    diff = workspace_diff(home, "s-1", config)
    assert [(f.path, f.left_out) for f in diff.files] == [
        ("a.txt", ""), ("b.txt", "the diff is too long to show whole"),
        ("c.txt", "the diff is too long to show whole")]
    assert "+changed 99" in diff.files[0].patch and diff.files[1].patch == ""
    assert [f.added_lines for f in diff.files] == [100, 100, 100]  # still counted
    assert "2 file(s) are listed without their patch" in "\n".join(diff.notes)


def test_a_trouper_home_inside_the_workspace_is_never_copied_nor_shown(tmp_path):
    ws = tmp_path / "me"
    ws.mkdir()
    (ws / "project.txt").write_text("mine\n")
    home = Home.at(ws / ".trouper")
    (home.root / "trouper.db").write_text("the store\n")
    private_dir(home.session_dir("s-1"))
    (home.session_dir("s-1") / "secrets.json").write_text('{"K": "a secret value"}')
    config = started(home, ws)
    (home.root / "trouper.db").write_text("the store, later\n")
    (ws / "project.txt").write_text("mine, changed\n")
    diff = workspace_diff(home, "s-1", config)
    assert [f.path for f in diff.files] == ["project.txt"]
    found = subprocess.run(["git", "--git-dir", str(home.session_dir("s-1") / "baseline.git"),
                            "grep", "-I", "secret", "refs/trouper/baseline"],
                           capture_output=True, text=True)
    assert found.returncode == 1 and found.stdout == ""  # no file of the home in the copy


def test_a_file_holding_a_secret_value_is_not_copied_into_the_baseline(home, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".env").write_text("TOKEN=tok-1234567890\n")
    (ws / "app.py").write_text("print(1)\n")
    made = SessionConfig(task="t", llm=LLM, workspace=str(ws))
    private_dir(home.session_dir("s-1"))
    take_baseline(home, "s-1", made, Settings(), secrets=["tok-1234567890", "abc"])
    assert read_baseline(home, "s-1").with_secrets == (".env",)
    objects = home.session_dir("s-1") / "baseline.git"
    found = subprocess.run(["git", "--git-dir", str(objects), "grep", "-I", "tok-1234567890",
                            "refs/trouper/baseline"], capture_output=True, text=True)
    assert found.returncode == 1, found.stdout  # the copy holds no secret value
    (ws / ".env").write_text("TOKEN=tok-1234567890\nMORE=1\n")
    (ws / "app.py").write_text("print(2)\n")
    diff = workspace_diff(home, "s-1", made)
    assert [f.path for f in diff.files] == ["app.py"]
    assert "held a secret value of the session when it started are not compared (never " \
           "copied): .env" in "\n".join(diff.notes)


def test_a_secret_with_a_lone_surrogate_keeps_out_the_file_that_holds_its_text(home, tmp_path):
    """A lone surrogate cannot be encoded: the baseline once failed on it (the daemon's
    create answered 500); a file holds such a value as text can, with U+FFFD for it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "out.txt").write_text("tok-\ufffd-1234567890\n")
    (ws / "app.py").write_text("print(1)\n")
    made = SessionConfig(task="t", llm=LLM, workspace=str(ws))
    private_dir(home.session_dir("s-1"))
    take_baseline(home, "s-1", made, Settings(), secrets=["tok-\ud800-1234567890"])
    assert read_baseline(home, "s-1").with_secrets == ("out.txt",)


def test_a_reflog_the_agent_forged_never_hands_git_an_option(tmp_path):
    """The clone's reflog is in the workspace, which the agent writes; its commit goes to
    git outside the sandbox, so ``--index-output=PATH`` there would overwrite PATH."""
    from trouper.workspace_diff.compare import Unavailable, clone_commit

    logs = tmp_path / "ws" / ".git" / "logs"
    logs.mkdir(parents=True)
    victim = tmp_path / "victim"
    forged = f"0 --index-output={victim} x <e> 0 +0\tclone: from /repo\n"
    (logs / "HEAD").write_text(forged)
    with pytest.raises(Unavailable, match="does not name the commit"):
        clone_commit(tmp_path / "ws")
    real = "0" * 40 + " " + "ab" * 20 + " x <e> 0 +0\tclone: from /repo\n"
    (logs / "HEAD").write_text(real)
    assert clone_commit(tmp_path / "ws") == "ab" * 20
