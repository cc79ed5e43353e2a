"""I6 (docs/promises.md): a failed write is a session state with its cause, not a crash loop.

The disk test mounts a small tmpfs for the home (we are root in CI; elsewhere it skips
with the reason), fills it while a command runs, and frees it again.
"""

from __future__ import annotations

import errno
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState, ObservationEvent, StateChanged, Trouper
from trouper.store.faults import storage_fault
from trouper.testing import actor_pid, check_log, wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

GATE = "touch waiting; while [ ! -f go ]; do sleep 0.02; done; "


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Write zeros until the disk is full; return the file that holds them."""
    filler = disk / "filler"
    chunk = b"\0" * (256 * 1024)
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(chunk)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


class _KeptFull:
    """The disk filled, and kept full until ``free()``: a page another process frees (a
    spool file removed after its command) is taken back at once, as a full disk's other
    writers would, so the session cannot leave the fault before the test frees it (a
    journal retry that found such a page once moved the session back to RUNNING)."""

    def __init__(self, disk: Path) -> None:
        self.filler = _fill(disk)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._take_back, daemon=True)
        self._thread.start()

    def _take_back(self) -> None:
        with open(self.filler, "ab", buffering=0) as out:  # unbuffered: nothing left to
            while not self._stop.is_set():                 # flush into a full disk at close
                try:
                    out.write(b"\0" * 4096)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    self._stop.wait(0.005)  # the disk is full: look again soon

    def free(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.filler.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("then, shown", [
    ("echo released", "released"),  # small: the sandbox's journal is the first to fail
    ("seq 1 30000", "30000"),  # a large outcome: the event store's WAL must grow and fails
])
def test_a_full_disk_is_error_naming_it_then_the_session_finishes(scripted, tmp_path,
                                                                   small_disk, then, shown):
    _, llm = scripted([{"tool": "run", "args": {"command": GATE + then}},
                       {"tool": "run", "args": {"command": "echo after"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    workspace = tmp_path / "ws"
    with Trouper(home=small_disk / "home") as t:
        session = t.start_session("fill the disk", llm=llm, workspace=workspace)
        wait_until(lambda: (workspace / "waiting").exists(), 30, "the gated command to run")
        controller = actor_pid(session, "controller")
        full = _KeptFull(small_disk)
        try:
            (workspace / "go").touch()
            cause = wait_until(lambda: _error_cause(session), 15, "ERROR naming the full disk")
            assert "is full" in cause, cause
            assert actor_pid(session, "controller") == controller  # no restart loop
            assert session.wait(timeout=2) == AgentState.ERROR  # not settled: it waits on
        finally:
            full.free()
        assert session.wait(timeout=60) == AgentState.FINISHED
        events = list(session.events())
    assert check_log(events) == []
    outcomes = [e.outcome for e in events if isinstance(e, ObservationEvent)]
    assert [o.status for o in outcomes] == ["ok", "ok", "ok"]
    assert shown in outcomes[0].content
    errors = [e.reason for e in events
              if isinstance(e, StateChanged) and e.state == AgentState.ERROR]
    assert any("is full" in r for r in errors), errors


@pytest.mark.slow
def test_a_session_process_that_starts_on_a_full_disk_waits_then_carries_on(
        scripted, tmp_path, small_disk):
    """The session's process is killed while the disk is full, so its successor starts
    with a store it cannot claim: it waits in the fault (no restart loop), refuses a
    command at once with the cause, and carries on to the end once the disk is freed.
    Before, its boot failed again and again until the root gave up on it, and the
    session stayed in ERROR after the disk was freed."""
    from trouper import InvalidRequest
    from trouper.testing import kill_actor

    with Trouper(home=small_disk / "home") as t:
        session, filler = _in_the_fault(t, scripted, tmp_path, small_disk)
        root = actor_pid(session, "root")
        killed = kill_actor(session, "controller")
        # its pid file cannot be written on the full disk: the root's child named for it
        successor = wait_until(lambda: _session_process(root, killed), 30, "its successor")
        with pytest.raises(InvalidRequest, match="is full"):
            session.pause()  # refused at once, not after the 30 s request timeout
        assert _session_process(root, killed) == successor  # it waits: no restart loop
        filler.unlink()
        assert session.wait(timeout=60) == AgentState.FINISHED, session.record.state_reason
        events = list(session.events())
    assert check_log(events) == []
    assert [e.outcome.status for e in events if isinstance(e, ObservationEvent)][-2:] == [
        "ok", "ok"]


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["runtime", "sandbox"])
def test_a_sandbox_or_driver_that_dies_while_the_disk_is_full_is_back_once_it_is_freed(
        scripted, tmp_path, small_disk, victim):
    """Two faults at once: the sandbox or its RuntimeProxy fails while the store takes no
    writes. The harness's request is answered (it was dropped unanswered while the store
    was faulted), and once the disk is freed the session carries on to the end with one
    outcome an action."""
    from trouper import InvalidRequest
    from trouper.testing import kill

    with Trouper(home=small_disk / "home") as t:
        session, filler = _in_the_fault(t, scripted, tmp_path, small_disk)
        kill(session, victim, timeout_s=10)
        with pytest.raises(InvalidRequest, match="is full"):
            session.pause()
        filler.unlink()
        assert session.wait(timeout=60) == AgentState.FINISHED, session.record.state_reason
        events = list(session.events())
    assert check_log(events) == []


@pytest.mark.slow
def test_a_trouper_reopened_on_a_full_disk_restores_its_session_once_it_is_freed(
        scripted, tmp_path, small_disk):
    """The program closes while the disk is full and opens its home again: the session's
    new process waits for the store (shown as the fault) and, the same process, carries
    on once the disk is freed."""
    with Trouper(home=small_disk / "home") as t:
        session, filler = _in_the_fault(t, scripted, tmp_path, small_disk)
    with Trouper(home=small_disk / "home") as t:
        again = t.session(session.id)
        cause = wait_until(lambda: _error_cause(again), 15, "the fault shown again")
        assert "is full" in cause, cause
        root = actor_pid(again, "root")
        waiting = wait_until(lambda: _session_process(root, 0), 15, "its process")
        filler.unlink()
        assert again.wait(timeout=60) == AgentState.FINISHED, again.record.state_reason
        assert _session_process(root, 0) == waiting  # the one that waited: no restart loop
        events = list(again.events())
    assert check_log(events) == []


def _in_the_fault(t: Trouper, scripted, tmp_path: Path,
                  disk: Path) -> tuple[Any, Path]:
    """A session whose large outcome came on a full disk: it waits in the store fault;
    and the file that fills the disk (unlink it to free the disk)."""
    _, llm = scripted([{"tool": "run", "args": {"command": GATE + "seq 1 30000"}},
                       {"tool": "run", "args": {"command": "echo after"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    workspace = tmp_path / "ws"
    session = t.start_session("fill the disk", llm=llm, workspace=workspace)
    wait_until(lambda: (workspace / "waiting").exists(), 30, "the gated command to run")
    filler = _fill(disk)
    (workspace / "go").touch()
    wait_until(lambda: _error_cause(session), 15, "ERROR naming the full disk")
    return session, filler


def _session_process(root: int | None, not_pid: int) -> int | None:
    """The one live agent loop under the root (its child, or split its grandchild), other
    than ``not_pid``."""
    from trouper.actors.base import PROCESS_NAMES
    from trouper.host.processes import children_of

    def named(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return ""

    under = children_of(root or 0)
    under += [grandchild for child in under for grandchild in children_of(child)]
    found = [pid for pid in under
             if pid != not_pid and named(pid) == PROCESS_NAMES["controller"]]
    return found[0] if len(found) == 1 else None


def _error_cause(session) -> str | None:
    """The cause clients are shown: the fault overlay, or the ERROR the log holds."""
    fault = session.fault
    if fault:
        return fault
    record = session.record
    return record.state_reason if record.state == AgentState.ERROR else None


def test_store_errors_are_named_for_the_user():
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorname = "SQLITE_FULL"
    assert storage_fault(full).kind == "full"
    read_only = sqlite3.OperationalError("attempt to write a readonly database")
    read_only.sqlite_errorname = "SQLITE_READONLY_DBMOVED"
    assert storage_fault(read_only).kind == "read_only"
    assert storage_fault(OSError(errno.EROFS, "Read-only file system")).kind == "read_only"
    assert storage_fault(OSError(errno.ENOSPC, "No space")).cause.startswith(
        "the disk holding the home is full")
    assert storage_fault(ValueError("not a storage fault")) is None
    assert storage_fault(sqlite3.IntegrityError("UNIQUE constraint failed")) is None
