"""The sandbox zygote: servers forked from it are as if started afresh, it opens no door,
and it ends with the program's actors (runtimes/sandbox_zygote.py, sandbox/zygote.py)."""

from __future__ import annotations

import os
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from trouper import AgentState, Trouper
from trouper.host.processes import descendants, parent_of, pid_alive, process_name
from trouper.messages.actions import RunCommand
from trouper.runtimes import sandbox_zygote
from trouper.runtimes.local import LocalSandbox
from trouper.testing import kill_sandbox, wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it


def zygotes() -> list[int]:
    """The sandbox zygotes this test process started (its children of that name)."""
    return [p for p in descendants([os.getpid()])
            if p != os.getpid() and process_name(p) == "trouper-zygote"]


def parent_of_a_new_server(tmp_path: Path) -> int | None:
    """Start a LocalSandbox in ``tmp_path``; the parent of its server (then stopped)."""
    sandbox = LocalSandbox("z", tmp_path / "ws", tmp_path / "rt")
    try:
        sandbox.start()
        server = sandbox.server_pid()
        assert server is not None
        return parent_of(server)
    finally:
        sandbox.stop()


@pytest.fixture
def zygote(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A zygote of this test process, as a ``Trouper`` starts one; released at the end."""
    monkeypatch.delenv(sandbox_zygote.ENABLED_ENV, raising=False)
    before = set(zygotes())
    sandbox_zygote.prepare()
    try:
        sandbox_zygote.ensure_started()
        (pid,) = wait_until(lambda: set(zygotes()) - before, 10, "the zygote to start")
        yield pid
    finally:
        sandbox_zygote.release()


def test_a_forked_server_is_as_if_started_afresh(zygote: int, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONLY_IN_THE_PROGRAM", "leak")
    sandbox = LocalSandbox("z1", tmp_path / "ws", tmp_path / "rt", env={"MY_VAR": "mine"},
                           secret_names=(),
                           shell_umask=0o022)
    sandbox.start()
    try:
        server = sandbox.server_pid()
        assert server is not None and parent_of(server) == zygote  # forked, not started afresh
        assert process_name(server) == "trouper-sandbox"
        assert os.getsid(server) == server  # a session of its own: outlives its starter
        assert os.readlink(f"/proc/{server}/cwd") == str(sandbox.state_dir)
        log = sandbox.state_dir / "server.log"
        assert stat.S_IMODE(log.stat().st_mode) == 0o600 and log.read_text()
        outcome = sandbox.runtime.execute(
            "a1", RunCommand(command="env; umask; pwd"), timeout_s=10, no_output_timeout_s=5)
        assert "MY_VAR=mine" in outcome.content  # the request's environment...
        assert "ONLY_IN_THE_PROGRAM" not in outcome.content  # ...and nothing else's:
        assert sandbox_zygote.ENABLED_ENV not in outcome.content  # not the zygote's own
        assert "0022" in outcome.content and str(sandbox.workspace) in outcome.content
        # the harness finds and kills it through the runtime interface, as any server
        assert sandbox.running() and sandbox.kill() == server
        wait_until(lambda: not pid_alive(server), 10, "the killed server to go")
        assert sandbox.start() is False  # a new one, forked again
        assert parent_of(sandbox.server_pid() or 0) == zygote
    finally:
        sandbox.stop()


def test_the_zygote_opens_no_door(zygote: int) -> None:
    """No listener of any kind: only the channel's holders (the program and its actors)
    can ask it for anything."""
    listening = set()
    with open("/proc/net/unix") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            if int(fields[3], 16) & 0x10000:  # __SO_ACCEPTCON: a listening socket
                listening.add(fields[6])
    sockets = set()
    for fd in os.listdir(f"/proc/{zygote}/fd"):
        link = os.readlink(f"/proc/{zygote}/fd/{fd}")
        if link.startswith("socket:["):
            sockets.add(link[8:-1])
    assert sockets and not sockets & listening
    inet = {line.split()[9] for table in ("/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp")
            for line in open(table).read().splitlines()[1:]}
    assert not sockets & inet


def test_a_bad_request_is_refused_and_the_zygote_serves_on(
        zygote: int, tmp_path: Path) -> None:
    channel = socket.socket(fileno=os.dup(sandbox_zygote.channel_fd() or -1))
    mine, theirs = socket.socketpair()
    with channel, mine:
        socket.send_fds(channel, [b"s"], [theirs.fileno()])
        theirs.close()
        mine.settimeout(10)
        mine.sendall(b'{"not": "a request"}\n')
        assert b"error" in mine.recv(4096)
    assert pid_alive(zygote)  # it answered and lives on
    sandbox = LocalSandbox("z2", tmp_path / "ws", tmp_path / "rt")
    try:
        sandbox.start()
        server = sandbox.server_pid()
        assert server is not None and parent_of(server) == zygote
        assert sandbox.runtime.alive()["pid"] == server
    finally:
        sandbox.stop()


def test_without_a_zygote_servers_start_afresh(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sandbox_zygote.ENABLED_ENV, "0")
    sandbox_zygote.prepare()  # switched off: makes nothing
    try:
        sandbox_zygote.ensure_started()
        assert sandbox_zygote.channel_fd() is None
        assert parent_of_a_new_server(tmp_path) == os.getpid()  # started afresh, here
    finally:
        sandbox_zygote.release()


def test_sessions_fork_their_servers_and_the_zygote_ends_with_the_program(
        scripted, tmp_path: Path) -> None:
    _, llm = scripted([{"tool": "run", "args": {"command": "echo one >> ledger.txt"}},
                       {"tool": "run", "args": {"command": "touch started; sleep 1; "
                                                "echo two >> ledger.txt"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    before = set(zygotes())
    with Trouper(home=tmp_path / "home") as t:
        assert set(zygotes()) == before  # nothing started before a session needs it
        session = t.start_session("t", llm=llm, workspace=tmp_path / "ws")
        wait_until(lambda: (tmp_path / "ws" / "started").exists(), 60, "the slow command")
        (zygote,) = set(zygotes()) - before
        kill_sandbox(session)  # mid-command: lost, never run again; a new server forked
        assert session.wait(timeout=60) == AgentState.FINISHED
        server = LocalSandbox(session.id, tmp_path / "ws",
                              t.home.runtime_dir(session.id)).server_pid()
        assert server is not None and parent_of(server) == zygote
        assert (tmp_path / "ws" / "ledger.txt").read_text() == "one\n"
    wait_until(lambda: not pid_alive(zygote), 10, "the zygote to end with the program")


def test_a_killed_zygote_leaves_servers_starting_afresh(zygote: int, tmp_path: Path) -> None:
    import signal

    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: not pid_alive(zygote), 10, "the zygote to die")
    assert parent_of_a_new_server(tmp_path) == os.getpid()  # started afresh, here


def test_a_forked_server_s_exit_status_reaches_its_starter(zygote: int, tmp_path: Path
                                                          ) -> None:
    """The zygote reaps its servers: it tells each starter the status, as ``poll`` would
    tell a parent (here argparse's 2 for missing arguments), and forgets a starter that
    closed its end."""
    (tmp_path / "rt").mkdir(mode=0o700)
    log = tmp_path / "rt" / "server.log"
    forked = sandbox_zygote.spawn([], {}, tmp_path / "rt", log, 0o077)
    assert forked is not None
    pid, status = forked
    with status:
        code = wait_until(lambda: sandbox_zygote.read_exit(status), 10, "the exit status")
        assert code == 2 and not pid_alive(pid) and "arguments are required" in log.read_text()
    quiet = sandbox_zygote.spawn(["--state-dir", str(tmp_path / "rt"), "--workspace",
                                  str(tmp_path / "ws"), "--idle-timeout-s", "60"], {},
                                 tmp_path / "rt", log, 0o077)
    assert quiet is not None
    quiet[1].close()  # no longer asking: the server lives on, the zygote stays well
    try:
        wait_until(lambda: (tmp_path / "rt" / "server.json").exists(), 10, "the server")
    finally:
        os.kill(quiet[0], signal.SIGKILL)  # on a failure too: nothing is left running
    wait_until(lambda: not pid_alive(quiet[0]), 10, "the server's end")
    assert pid_alive(zygote)


def test_a_pid_answer_leaves_an_exit_status_right_behind_it_unread() -> None:
    """A server that exits at once (refused its folder's lock, bad arguments) is reaped
    before its starter reads the pid: both lines are then waiting; the pid is read, the
    status stays for ``read_exit``."""
    mine, zygote_end = socket.socketpair()
    with mine, zygote_end:
        zygote_end.sendall(b'{"pid": 42}\n{"exit": 3}\n')
        assert sandbox_zygote._read_answer(mine) == {"pid": 42}  # noqa: SLF001
        mine.setblocking(False)
        assert sandbox_zygote.read_exit(mine) == 3


def test_a_zygote_killed_while_its_server_starts_does_not_fail_the_start(
        zygote: int, tmp_path: Path) -> None:
    """The zygote tells a server's exit; killed, it can tell nothing, and its server
    (which lives on, leading its own session) is judged by its pid as before: a start
    does not fail for want of the zygote's word."""
    from trouper.runtimes.launch import launch_server

    state = tmp_path / "rt"
    state.mkdir(mode=0o700)
    launched = launch_server(["--state-dir", str(state), "--workspace", str(tmp_path / "ws"),
                              "--idle-timeout-s", "60"], {}, state)
    try:
        assert launched.status is not None  # forked by the zygote
        os.kill(zygote, signal.SIGKILL)
        wait_until(lambda: not pid_alive(zygote), 10, "the zygote to die")
        assert pid_alive(launched.pid) and launched.exit_code() is None
        os.kill(launched.pid, signal.SIGKILL)
        wait_until(lambda: launched.exit_code() is not None, 10, "the server's end")
    finally:
        launched.close()
        if pid_alive(launched.pid):
            os.kill(launched.pid, signal.SIGKILL)
