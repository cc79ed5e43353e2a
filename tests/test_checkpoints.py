"""The checkpoint store: snapshots of a workspace kept outside it, deduplicated, restored
whole into an empty folder, with what they left out said per path, and the workspace
(and a git repository in it) never written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from trouper.runtimes.sandbox.checkpoints import Checkpoints


def tree(root: Path) -> dict[str, object]:
    """Every entry under ``root``: file contents and modes, link targets, folders."""
    found: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = "dir"
        elif path.is_file():
            found[rel] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return found


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "a.py").write_text("print('a')\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "link").symlink_to("/etc/passwd")  # kept as a link, never followed
    (ws / "node_modules" / "dep").mkdir(parents=True)
    (ws / "node_modules" / "dep" / "big.js").write_text("x" * 1000)
    return ws


def test_a_snapshot_restores_the_workspace_as_it_was_then(ws, tmp_path):
    store = Checkpoints(str(tmp_path / "store"), str(ws))
    first = store.take("a1")
    before = tree(ws)
    (ws / "src" / "pkg" / "a.py").write_text("print('changed')\n")
    (ws / "new.txt").write_text("new\n")
    store.take("a2")
    store.restore("a1", str(tmp_path / "r1"))
    store.restore("a2", str(tmp_path / "r2"))
    expected = {k: v for k, v in before.items() if not k.startswith("node_modules")}
    assert tree(tmp_path / "r1") == expected
    assert tree(tmp_path / "r2") == {k: v for k, v in tree(ws).items()
                                     if not k.startswith("node_modules")}
    assert first["skipped"] == 1 and store.manifest("a1")["skipped"] == {
        "node_modules": "ignored"}


def test_content_is_stored_once_and_an_unchanged_tree_is_one_line(ws, tmp_path, monkeypatch):
    store = Checkpoints(str(tmp_path / "store"), str(ws))
    assert store.take("a1")["new_bytes"] > 0
    hashed: list[str] = []
    real = store._store
    monkeypatch.setattr(store, "_store", lambda path: hashed.append(path) or real(path))
    again = store.take("a2")
    assert again["new_bytes"] == 0 and hashed == []  # unchanged files are not read again
    assert (tmp_path / "store" / "snapshots" / "a2.json").read_text() == '{"same_as": "a1"}'
    (ws / "copy.py").write_text("print('a')\n")  # the same content under another name
    third = store.take("a3")
    assert third["new_bytes"] == 0 and hashed == [str(ws / "copy.py")]


def test_what_it_cannot_or_should_not_keep_is_named_and_never_blocks(ws, tmp_path):
    os.mkfifo(ws / "pipe")  # opening it would block: it is never opened
    (ws / "huge.bin").write_bytes(b"\0" * 2048)
    store = Checkpoints(str(tmp_path / "store"), str(ws), max_file_bytes=1024)
    store.take("a1")
    skipped = store.manifest("a1")["skipped"]
    assert skipped["pipe"] == "not a regular file"
    assert skipped["huge.bin"].startswith("over max_file_bytes")
    assert store.restore("a1", str(tmp_path / "r")) == skipped
    assert not (tmp_path / "r" / "pipe").exists()


def test_a_git_repository_in_the_workspace_is_read_never_written(ws, tmp_path):
    git = ["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@example.test"]
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / ".gitignore").write_text("node_modules/\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    (ws / "src" / "pkg" / "a.py").write_text("print('work in progress')\n")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
              for p in (ws / ".git").rglob("*")}
    store = Checkpoints(str(tmp_path / "store"), str(ws))
    store.take("a1")
    after = {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
             for p in (ws / ".git").rglob("*")}
    assert after == before
    store.restore("a1", str(tmp_path / "r"))
    status = subprocess.run(["git", "-C", str(tmp_path / "r"), "status", "--porcelain"],
                            capture_output=True, text=True, check=True)
    assert status.stdout == " M src/pkg/a.py\n"  # the repository and its work, as they were


def test_restoring_needs_an_empty_folder_and_a_known_snapshot(ws, tmp_path):
    store = Checkpoints(str(tmp_path / "store"), str(ws))
    store.take("a1")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(OSError, match="not empty"):
        store.restore("a1", str(tmp_path / "full"))
    with pytest.raises(KeyError):
        store.restore("nope", str(tmp_path / "r"))


@pytest.mark.parametrize("given", [{"max_file_bytes": 0}, {"max_files": True},
                                   {"ignore": "node_modules"}, {"ignore": ["a/b"]}, "yes"])
def test_an_execute_request_s_limits_are_checked(given):
    from trouper.runtimes.sandbox.requests import BadRequest, checkpoint_limits

    with pytest.raises(BadRequest):
        checkpoint_limits(given)
    assert checkpoint_limits(True) == {} and checkpoint_limits(None) is None
    assert checkpoint_limits({"max_files": 5, "ignore": ["x"]}) == {"max_files": 5,
                                                                    "ignored": ("x",)}


def test_the_store_is_owner_only_and_a_restore_never_sets_a_set_id_bit(ws, tmp_path):
    (ws / "tool").write_text("#!/bin/sh\n")
    (ws / "tool").chmod(0o4755)
    old = os.umask(0o022)
    try:
        store = Checkpoints(str(tmp_path / "store"), str(ws))
        store.take("a1")
    finally:
        os.umask(old)
    loose = [p for p in [tmp_path / "store", *(tmp_path / "store").rglob("*")]
             if p.stat().st_mode & 0o077]
    assert loose == []
    store.restore("a1", str(tmp_path / "r"))
    assert (tmp_path / "r" / "tool").stat().st_mode & 0o7777 == 0o755
