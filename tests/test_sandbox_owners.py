"""A root sandbox server keeps the workspace's ownership (runtimes/sandbox/owners.py): what
the file tools and the clone make belongs to the workspace's owner, a rewritten file keeps
its owner, and a tree is handed over without following a symlink or a hard link out.

The rules act only when the server is root (as in CI, and under a root daemon); these
tests need root to give files away, and skip without it. The Docker runtime's own choice
of user (tests/test_docker_privileges.py for the container) is checked here as a table.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from trouper.config.models import DockerRuntime
from trouper.runtimes.docker_user import choose_user, prepare_io
from trouper.runtimes.sandbox import files
from trouper.runtimes.sandbox.clone import clone
from trouper.runtimes.sandbox.output import fit_text
from trouper.runtimes.sandbox.owners import chown_tree

AGENT = (4321, 4322)
"""The uid:gid a workspace is handed to (as a container's user would be)."""
OTHER = (5555, 5556)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="giving files away needs root "
                               "(CI runs as root)")


def owner(path: Path) -> tuple[int, int]:
    info = path.lstat()
    return info.st_uid, info.st_gid


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace that belongs to AGENT."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, *AGENT)
    return workspace


@root_only
def test_the_file_tools_give_what_they_make_to_the_folders_owner(ws):
    files.write_file(str(ws), "deep/er/new.txt", "one\n", umask=0o022)
    for made in ("deep", "deep/er", "deep/er/new.txt"):
        assert owner(ws / made) == AGENT, made
    (ws / "theirs").mkdir()
    os.chown(ws / "theirs", *OTHER)
    files.write_file(str(ws), "theirs/x.txt", "x\n")
    assert owner(ws / "theirs" / "x.txt") == OTHER  # the folder it is made in, not the root


@root_only
def test_a_rewritten_file_keeps_its_owner_and_loses_setuid_and_setgid(ws):
    kept = ws / "kept.txt"
    kept.write_text("old\n")
    os.chown(kept, *OTHER)
    kept.chmod(0o640)
    files.write_file(str(ws), "kept.txt", "new\n")
    assert owner(kept) == OTHER and stat.S_IMODE(kept.stat().st_mode) == 0o640
    files.edit_file(str(ws), "kept.txt", "new", "newer")
    assert owner(kept) == OTHER and kept.read_text() == "newer\n"
    setid = ws / "tool"
    setid.write_text("#!/bin/sh\n")
    os.chown(setid, *AGENT)
    setid.chmod(0o6755)
    files.edit_file(str(ws), "tool", "sh", "sh -e")
    assert stat.S_IMODE(setid.stat().st_mode) == 0o755 and owner(setid) == AGENT


@root_only
def test_a_cut_outputs_full_text_is_the_workspace_owners(ws):
    _, _, path = fit_text("x" * 5000, 100, str(ws), "a1")
    assert path is not None
    for made in (".trouper", ".trouper/outputs", path):
        assert owner(ws / made) == AGENT, made


@root_only
def test_a_tree_is_handed_over_without_following_links_out(tmp_path, ws):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_text("root's\n")
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f").write_text("f\n")
    (ws / "link-to-dir").symlink_to(outside)
    (ws / "a" / "link-to-file").symlink_to(secret)
    os.link(secret, ws / "hard")  # a hard link: chowning it would chown the outside file
    for path in (ws / "a", ws / "a" / "b", ws / "a" / "b" / "f"):
        os.chown(path, 0, 0)
    changed, skipped = chown_tree(str(ws), *OTHER)
    assert (changed, skipped) == (6, 1)
    for path in ("", "a", "a/b", "a/b/f", "link-to-dir", "a/link-to-file"):
        assert owner(ws / path) == OTHER, path
    assert owner(secret) == (0, 0) and owner(outside) == (0, 0)


@root_only
def test_a_clone_as_root_is_the_workspace_owners_and_reports_its_head(tmp_path, ws):
    origin = tmp_path / "origin"
    origin.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for argv in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "one"]):
        (origin / "README.md").write_text("hello\n")
        subprocess.run(["git", *argv], cwd=origin, env=env, check=True, capture_output=True)
    outcome = clone(str(ws), str(origin), None, 60)
    assert outcome["status"] == "ok" and "main at " in outcome["content"], outcome
    made = [ws / p for p in ("README.md", ".git", ".git/HEAD", ".git/objects")]
    assert all(owner(p) == AGENT for p in made), {str(p): owner(p) for p in made}
    assert not [p for p in ws.rglob("*") if owner(p) != AGENT]


@pytest.mark.parametrize(("configured", "euid", "ws_owner", "expected"), [
    (None, 1000, (0, 0), ((1000, 1001), False)),  # not root: the caller, always
    ("2000:2001", 1000, (0, 0), ((2000, 2001), False)),
    (None, 0, (1000, 1000), ((1000, 1000), False)),  # root: the workspace owner's
    (None, 0, (1000, 0), ((1000, 1000), False)),  # never root's group either
    (None, 0, (0, 0), ((65532, 65532), True)),  # root's workspace: the dedicated id, handed
    ("2000", 0, (0, 0), ((2000, 2000), True)),
    ("2000", 0, (1000, 1000), ((2000, 2000), False)),
])
def test_the_container_user_is_never_root(configured, euid, ws_owner, expected):
    assert choose_user(configured, ws_owner, euid=euid, ids=(1000, 1001),
                       dedicated=65532) == expected


@pytest.mark.parametrize("user", ["0", "0:0", "1000:0", "0:1000", "root", "nobody", "1000:",
                                  "-1", " 1000", "1e3"])
def test_a_configured_user_must_be_numeric_and_not_root(user):
    with pytest.raises(ValueError, match="root|numeric"):
        DockerRuntime(image="busybox", user=user)
    assert DockerRuntime(image="busybox", user="1000").user == "1000"


def test_the_input_folder_is_owner_only_and_the_container_users(tmp_path):
    io_dir = tmp_path / "io"
    user = AGENT if os.geteuid() == 0 else (os.getuid(), os.getgid())
    prepare_io(io_dir, user)
    assert stat.S_IMODE(io_dir.stat().st_mode) == 0o700 and owner(io_dir) == user
