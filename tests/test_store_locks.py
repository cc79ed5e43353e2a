"""SQLite's locks are per process and easy to lose: these tests read them in /proc/locks.

Two ways trouper once lost them, and with them committed rows (a session's row written by
the program vanished while its Controller appended events): opening and closing another
descriptor on the database (POSIX drops every lock the process holds on that file), and
pointing a forked child's inherited descriptors at /dev/null (SQLite's per-process inode
table survives the fork, and the child's next connection locks through those numbers).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from trouper.actors.forking import release_inherited_descriptors
from trouper.home.paths import Home
from trouper.store import open_store

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs /proc/locks")]


def _locks(pid: int, home: Home) -> set[tuple[str, str, str]]:
    """(file, kind, start) of the POSIX locks ``pid`` holds on the store's files."""
    inodes = {}
    for suffix in ("", "-shm"):
        path = Path(f"{home.db_path}{suffix}")
        if path.exists():
            inodes[path.stat().st_ino] = suffix or "db"
    held = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1] == "POSIX" and fields[4] == str(pid):
            inode = int(fields[5].split(":")[2])
            if inode in inodes:
                held.add((inodes[inode], fields[3], fields[6]))
    return held


def test_opening_a_second_store_keeps_the_first_ones_locks(tmp_path):
    home = Home.at(tmp_path / "home")
    first = open_store(home)
    try:
        held = _locks(os.getpid(), home)
        assert ("-shm", "READ", "128") in held  # SQLite's dead-man switch: "I am here"
        second = open_store(home)  # what a second Trouper or a CLI command on the home does
        second.close()
        assert _locks(os.getpid(), home) == held
    finally:
        first.close()


def test_a_forked_actor_locks_the_real_files(tmp_path):
    """A process forked while the program holds a connection (as Thespian forks actors)
    and then opening its own must hold real locks on the store, visible to the others."""
    home = Home.at(tmp_path / "home")
    program = open_store(home)
    program.create_session("s-1", _config(tmp_path))
    ready, done = tmp_path / "ready", tmp_path / "done"  # FIFOs: the child opens them
    os.mkfifo(ready)                                       # after letting go of its fds
    os.mkfifo(done)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the FIFOs
        code = 1
        try:
            release_inherited_descriptors()  # what every forked actor does first
            store = open_store(home)
            conn = store._conn()  # noqa: SLF001 - hold the write lock as an append does
            conn.execute("BEGIN IMMEDIATE")
            ready.write_bytes(b"1")
            done.read_bytes()
            conn.execute("ROLLBACK")
            code = 0
        finally:
            os._exit(code)
    try:
        assert ready.read_bytes() == b"1"
        other = sqlite3.connect(home.db_path, timeout=0.2, isolation_level=None)
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")  # the child's write lock must be real
        finally:
            other.close()
    finally:
        done.write_bytes(b"1")
        _, status = os.waitpid(pid, 0)
        program.close()
    assert os.waitstatus_to_exitcode(status) == 0


def _config(tmp_path: Path):
    from trouper.config.models import LLMConfig, SessionConfig

    return SessionConfig(task="t", llm=LLMConfig(model="hosted_vllm/x"),
                         workspace=str(tmp_path))


def test_every_actor_holds_its_own_locks_on_the_store(scripted, tmp_path):
    """The actor system is forked before the program holds a connection: a Controller's
    connection then takes SQLite's "I am here" lock itself, so no other process can take
    the store for unused and reset its WAL under it."""
    from trouper import AgentState, Trouper
    from trouper.testing import actor_pid, wait_until

    gate = "touch waiting; while [ ! -e go ]; do sleep 0.05; done"
    _, llm = scripted([{"tool": "run", "args": {"command": gate}},
                       {"tool": "finish", "args": {"message": "done"}}])
    workspace = tmp_path / "ws"
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=workspace)
        wait_until(lambda: (workspace / "waiting").exists(), 30, "the gated command")
        controller = wait_until(lambda: actor_pid(session, "controller"), 30, "a controller")
        assert ("-shm", "READ", "128") in _locks(controller, trouper.home)
        (workspace / "go").touch()
        assert session.wait(timeout=60) == AgentState.FINISHED
