"""A shell's private temporary folder (made where an unreadable path splits a temporary
folder: a trouper home in /tmp) outlives a server killed with SIGKILL, which cannot
remove it; the next server that makes one in the same place removes it, and never one a
live server holds, one too young to be locked yet, a symlink, nor another user's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trouper.runtimes.sandbox import shell_policy
from trouper.runtimes.sandbox.shell_policy import TMPDIR_PREFIX, confine_shell


def confine(tmp: Path, workspace: Path) -> shell_policy.ShellConfinement:
    confined = confine_shell(str(workspace), (str(tmp),), (), (str(tmp / "home"),), True,
                             env={})
    assert confined.tmpdir is not None and Path(confined.tmpdir).parent == tmp
    return confined


def killed(tmp: Path, workspace: Path) -> Path:
    """The private folder of a server that died without closing its confinement."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, str(confine(tmp, workspace).tmpdir).encode())
        finally:
            os._exit(0)  # no close(): as SIGKILL leaves it
    os.close(write)
    path = Path(os.read(read, 4096).decode())
    os.close(read)
    os.waitpid(pid, 0)
    assert path.is_dir()
    return path


def test_the_next_server_removes_what_a_killed_one_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp, workspace = tmp_path / "tmp", tmp_path / "work"
    (tmp / "home").mkdir(parents=True)
    workspace.mkdir()
    live = confine(tmp, workspace)
    dead = killed(tmp, workspace)
    (dead / "left.txt").write_text("x")
    target = tmp_path / "not-a-tmpdir"
    target.mkdir()
    (tmp / f"{TMPDIR_PREFIX}link").symlink_to(target)
    others = tmp / f"{TMPDIR_PREFIX}others"
    others.mkdir()
    if os.geteuid() == 0:
        os.chown(others, 65532, 65532)
    else:
        others.rmdir()

    young = confine(tmp, workspace)  # the dead one changed less than a minute ago: kept
    assert dead.is_dir()
    monkeypatch.setattr(shell_policy, "STALE_AFTER_S", 0.0)
    later = confine(tmp, workspace)
    assert not dead.exists()
    assert Path(live.tmpdir).is_dir() and Path(young.tmpdir).is_dir()  # held by live ones
    assert target.is_dir() and (tmp / f"{TMPDIR_PREFIX}link").is_symlink()
    assert others.is_dir() or os.geteuid() != 0
    for confined in (live, young, later):
        confined.close()
        confined.close()  # idempotent
        assert not Path(confined.tmpdir).exists()
    assert sorted(p.name for p in tmp.iterdir()) == sorted(
        ["home", f"{TMPDIR_PREFIX}link", *([others.name] if others.exists() else [])])
