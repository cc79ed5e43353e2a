"""A runtime server's shells are contained like the local runtime's: never root when the
server is (the workspace owner's uid, or the dedicated unprivileged one for the root-owned
workspaces the server makes), no setuid or setgid file left behind, and no reading of the
server's token, its journals or another session's workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trouper.config.models import RemoteRuntime
from trouper.config.settings import settings
from trouper.messages.actions import RunCommand
from trouper.runtimes import load_sandbox
from trouper.runtimes.remote import RemoteSandbox
from trouper.runtimes.sandbox.confinement import available

pytestmark = pytest.mark.slow  # starts a runtime server


def sandbox_of(server, tmp_path: Path, session_id: str) -> RemoteSandbox:
    config = RemoteRuntime(url=server.url, token=server.token, ready_timeout_s=10)
    sandbox = load_sandbox(config, session_id=session_id, workspace=tmp_path / "unused",
                           state_dir=tmp_path / f"state-{session_id}")
    assert isinstance(sandbox, RemoteSandbox)
    sandbox.start()
    return sandbox


def run(sandbox: RemoteSandbox, action_id: str, command: str) -> str:
    return sandbox.runtime.execute(action_id, RunCommand(command=command), timeout_s=30,
                                   no_output_timeout_s=20).content


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid rule is for a server run as root")
def test_a_root_server_gives_no_shell_root_nor_a_setuid_file(remote_server, tmp_path):
    server = remote_server()
    sandbox = sandbox_of(server, tmp_path, "contained-1")
    try:
        dedicated = settings().sandbox_uid
        assert run(sandbox, "a1", "id -u; id -g").split() == [str(dedicated)] * 2
        shown = run(sandbox, "a2", "cp /bin/sh ./x && chmod 4755 x; chmod g+s x; "
                                   "install -m 6755 /bin/sh ./y; ls -ln x y")
        assert "Operation not permitted" in shown
        workspace = server.workspace("contained-1")
        for name in ("x", "y"):
            info = (workspace / name).stat() if (workspace / name).exists() else None
            assert info is None or (info.st_mode & 0o6000 == 0 and info.st_uid == dedicated)
        assert workspace.stat().st_uid == dedicated  # handed to the shell's user
    finally:
        sandbox.stop()


@pytest.mark.skipif(not available().get("landlock_abi"), reason="this kernel has no Landlock")
def test_a_shell_reads_neither_the_token_nor_journals_nor_another_session(remote_server,
                                                                         tmp_path):
    server = remote_server()
    first = sandbox_of(server, tmp_path, "contained-a")
    second = sandbox_of(server, tmp_path, "contained-b")
    try:
        run(first, "a1", "echo first-session-secret > notes.txt")
        other = server.workspace("contained-a") / "notes.txt"
        attempts = [
            f"cat {server.token_file}",
            f"cat {other}",
            f"ls {server.workdir}/contained-a/state",
            f"echo pwned > {server.workspace('contained-a')}/dropped",
        ]
        for n, command in enumerate(attempts):
            shown = run(second, f"b{n}", command)
            assert "Permission denied" in shown, (command, shown)
            assert server.token not in shown and "first-session-secret" not in shown
        assert not (server.workspace("contained-a") / "dropped").exists()
        assert run(second, "b9", "echo mine > own.txt && cat own.txt").strip() == "mine"
    finally:
        first.stop()
        second.stop()


def test_no_network_cuts_the_shells_sockets_but_unix(remote_server, tmp_path):
    import socket

    server = remote_server("--no-network")
    sandbox = sandbox_of(server, tmp_path, "contained-net")
    try:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            shown = run(sandbox, "n1", "python3 -c \"import socket; socket.create_connection("
                                       f"('127.0.0.1', {port}), timeout=5); print('reached')\"")
        assert "PermissionError" in shown and "reached" not in shown
        assert run(sandbox, "n2", "python3 -c \"import socket; socket.socketpair(); "
                                  "print('unix')\"").strip() == "unix"
    finally:
        sandbox.stop()
