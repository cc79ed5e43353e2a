"""A Docker sandbox never hands out the host's privileges: its shell is never root, no file
it makes keeps a setuid or setgid bit, and what the host-side tools make stays writable
by it. Run as root (as CI does): the workspace is root's (so the sandbox gets the
dedicated uid and the workspace), or a normal uid's (standing for trouper run by that
user: the container is that uid)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound

from trouper.config.models import DockerRuntime
from trouper.config.settings import settings
from trouper.messages.actions import EditFile, RunCommand, WriteFile
from trouper.runtimes.docker import DockerSandbox
from trouper.runtimes.docker_support import IO_MOUNT, LABEL_OWNER, LABEL_SESSION

pytestmark = [pytest.mark.slow, pytest.mark.docker,
              pytest.mark.skipif(os.geteuid() != 0, reason="the root cases need root (CI)")]

IMAGE = "trouper-test-busybox:latest"
LIMITS = {"timeout_s": 30.0, "no_output_timeout_s": 20.0}
NORMAL = (1000, 1000)
"""A normal user's uid:gid: a workspace of theirs stands for trouper run by them."""
ATTACKS = """
id -u; id -g
busybox cp /bin/busybox x && busybox chmod 4755 x
busybox cp /bin/busybox y && busybox chmod g+s y
busybox install -m 4755 /bin/busybox z
busybox mknod -m 4755 p1 p
busybox mkfifo -m 2755 p2
busybox mkdir -m 2755 d
busybox tar xf setid.tar
true
"""
"""setuid/setgid by chmod, by a mode given at creation (install if this busybox has it,
mknod, mkfifo, mkdir) and by O_CREAT with the archive's mode (tar)."""


@pytest.fixture
def make(tmp_path: Path, docker_homes: Callable[[Path], Path]
         ) -> Iterator[Callable[..., DockerSandbox]]:
    home = docker_homes(tmp_path / "home")
    made: list[DockerSandbox] = []

    def new(workspace: Path, session_id: str = "s-1", **config: Any) -> DockerSandbox:
        sandbox = DockerSandbox(session_id, workspace, home / "sessions" / session_id / "rt",
                                config=DockerRuntime(image=IMAGE, **config),
                                interrupt_grace_s=0.5)
        made.append(sandbox)
        return sandbox

    yield new
    for sandbox in reversed(made):
        sandbox.stop()


def run(sandbox: DockerSandbox, action_id: str, command: str) -> Any:
    return sandbox.runtime.execute(action_id, RunCommand(command=command), **LIMITS)


def setid_tar(path: Path) -> None:
    """An archive whose members are setuid and setgid (tar creates them with that mode)."""
    data = b"#!/bin/sh\necho hi\n"
    with tarfile.open(path, "w") as archive:
        for name, mode in (("su", 0o4755), ("sg", 0o2755)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            archive.addfile(info, io.BytesIO(data))


def setid_files(root: Path) -> list[str]:
    return sorted(f"{p.relative_to(root)} {stat.filemode(p.lstat().st_mode)}"
                  for p in [root, *root.rglob("*")]
                  if p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID))


@pytest.mark.parametrize("workspace_owner", ["root", "normal uid"])
def test_no_setuid_or_setgid_bit_survives_and_the_shell_is_not_root(
        make, tmp_path, workspace_owner):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    setid_tar(workspace / "setid.tar")
    expected = (settings().sandbox_uid,) * 2
    if workspace_owner == "normal uid":
        os.chown(workspace, *NORMAL)
        expected = NORMAL
    sandbox = make(workspace)
    sandbox.start()
    outcome = run(sandbox, "attack", ATTACKS)
    ids = tuple(int(n) for n in outcome.content.split()[:2])
    assert ids == expected and 0 not in ids
    assert "chmod: x: Operation not permitted" in outcome.content, outcome.content
    assert setid_files(workspace) == []
    assert (workspace / "x").exists() and (workspace / "d").is_dir()  # made, without the bits
    assert {(p.stat().st_uid, p.stat().st_gid) for p in (workspace / "x", workspace)} == {
        expected}


def test_the_input_folder_and_fifo_are_owner_only_and_the_containers(make, tmp_path,
                                                                      docker_client):
    sandbox = make(tmp_path / "ws")
    sandbox.start()
    uid = settings().sandbox_uid
    entries = [sandbox.io_dir, *sandbox.io_dir.iterdir()]
    assert [stat.S_ISFIFO(p.lstat().st_mode) for p in entries] == [False, True]
    assert {(stat.S_IMODE(p.lstat().st_mode), p.lstat().st_uid) for p in entries} == {
        (0o700, uid), (0o600, uid)}
    mounts = docker_client.containers.get(sandbox.container_id).attrs["Mounts"]
    assert [m["Source"] for m in mounts if m["Destination"] == IO_MOUNT] == [
        str(sandbox.io_dir)]
    assert run(sandbox, "a1", "echo fine").content == "fine\n"
    assert [p.name for p in sandbox.io_dir.iterdir() if not p.name.startswith("in-")] == []


def test_the_workspace_is_handed_over_and_file_tools_leave_what_the_shell_can_change(
        make, tmp_path):
    workspace = tmp_path / "ws"
    (workspace / "old" / "sub").mkdir(parents=True)
    (workspace / "old" / "sub" / "f.txt").write_text("made by root\n")
    sandbox = make(workspace)
    sandbox.start()
    uid = settings().sandbox_uid
    assert {p.lstat().st_uid for p in [workspace, *workspace.rglob("*")]} == {uid}
    execute = sandbox.runtime.execute
    assert execute("w", WriteFile(path="new/deep/n.txt", content="one\n"), **LIMITS).status == "ok"
    assert execute("e", EditFile(path="old/sub/f.txt", old="root", new="the host"),
                   **LIMITS).status == "ok"
    long = run(sandbox, "long", "seq 1 5000")  # cut: its whole text is kept in a file
    assert long.full_output_path
    changed = run(sandbox, "change", f"""
        echo two >> new/deep/n.txt && mv new/deep/n.txt new/n.txt && rmdir new/deep &&
        echo more >> old/sub/f.txt && rm -r old &&
        wc -l < {long.full_output_path} && rm {long.full_output_path} && echo all-done""")
    assert changed.exit_code == 0 and changed.content.split()[-2:] == ["5000", "all-done"]
    assert (workspace / "new" / "n.txt").read_text() == "one\ntwo\n"
    assert not [p for p in workspace.rglob("*") if p.lstat().st_uid != uid]


def test_a_container_made_as_root_by_an_older_trouper_is_replaced(make, tmp_path,
                                                                   docker_client):
    sandbox = make(tmp_path / "ws")
    old = docker_client.containers.run(
        IMAGE, ["sh", "-c", "read _"], detach=True, stdin_open=True, user="0:0",
        labels={LABEL_SESSION: "s-1", LABEL_OWNER: sandbox.owner, "trouper.epoch": "1"},
        volumes={str(tmp_path / "ws"): {"bind": "/workspace", "mode": "rw"}})
    try:
        sandbox.start()
        assert sandbox.container_id != old.id
        assert run(sandbox, "a1", "id -u").content.strip() == str(settings().sandbox_uid)
        with pytest.raises(NotFound):
            old.reload()
    finally:
        try:
            old.remove(force=True)
        except NotFound:
            pass
