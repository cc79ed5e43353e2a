"""Start and stop leave nothing behind: early kills, open/close cycles, orphans, zombies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from trouper.host.processes import pid_alive
from trouper.testing import wait_until
from trouper.testing.cgroups import new_cgroup, remove_cgroup

from accel import forkserver

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

def _marked(mark: str) -> list[int]:
    """Live processes of the program marked ``mark``: in its cgroup (every process it
    starts stays in it, setsid or not, whoever forked the program), or where there is
    none, with ``TROUPER_TEST_MARK=mark`` in their environment."""
    group = _GROUPS.get(mark)
    if group is not None:
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        return [pid for pid in pids if pid != os.getpid() and pid_alive(pid)]
    needle = f"TROUPER_TEST_MARK={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and pid_alive(int(entry)):
            found.append(int(entry))
    return found


_GROUPS: dict[str, Path] = {}


@pytest.fixture(autouse=True)
def _remove_cgroups():
    yield
    while _GROUPS:
        remove_cgroup(_GROUPS.popitem()[1])


def _program(home: Path, body: str, mark: str) -> Any:
    """``python -c`` with ``body``: forked from the suite's zygote into a cgroup of its
    own where one can be made, else started afresh with the mark in its environment."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from trouper import Trouper
        home = {str(home)!r}
        {textwrap.indent(textwrap.dedent(body), "        ").strip()}
    """)
    group = new_cgroup(f"trouper-test-{mark}")
    if group is not None:
        _GROUPS[mark] = group
        return forkserver.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cgroup=group)
    env = {**os.environ, "TROUPER_TEST_MARK": mark}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


@pytest.mark.slow
@pytest.mark.parametrize("delay_ms", [0, 20, 50, 80, 150, 300])
def test_a_program_killed_while_opening_leaves_no_process(tmp_path, delay_ms):
    mark = uuid.uuid4().hex
    ready = tmp_path / "importing-done"
    program = _program(tmp_path / "home", f"""
        import trouper.client.actor_system  # the heavy imports first: the kill hits the opening
        open({str(ready)!r}, "w").close()
        Trouper(home=home)
        time.sleep(60)
    """, mark)
    try:
        wait_until(ready.exists, 60, "the program to import trouper")
        time.sleep(delay_ms / 1000)  # the instant of the kill is the variable under test
        program.kill()
        program.wait(10)
        wait_until(lambda: _marked(mark) == [], 10,
                   f"trouper's processes to end after the kill: {_marked(mark)}")
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)
        program.kill()
        program.wait(10)


def test_a_new_trouper_ends_the_orphaned_system_of_a_dead_program(tmp_path):
    """The admin's own watch is the first line; a new open on the home is the second."""
    from trouper.actors import forking

    home = tmp_path / "home"
    mark = uuid.uuid4().hex
    program = _program(home, """
        t = Trouper(home=home)
        print("open", flush=True)
        time.sleep(60)
    """, mark)
    try:
        assert program.stdout is not None
        assert program.stdout.readline().strip() == b"open"
        admin = int((home / "actors" / "admin.pid").read_text().split()[0])
        os.kill(program.pid, signal.SIGSTOP)  # frozen but alive: its system is not an orphan
        assert forking.end_orphans(home) == []
        os.killpg(os.getpgid(admin), signal.SIGSTOP)  # freeze its own watch: test end_orphans
        os.kill(program.pid, signal.SIGKILL)
        program.wait(10)
        assert forking.end_orphans(home) == [admin]
        wait_until(lambda: not pid_alive(admin) and _marked(mark) == [], 10,
                   "every process of the dead program to end")
        assert forking.end_orphans(home) == []
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)
        program.kill()
        program.wait(10)


@pytest.mark.slow
def test_open_close_cycles_leave_no_zombie_and_no_process(tmp_path):
    mark = uuid.uuid4().hex
    program = _program(tmp_path / "home", """
        from trouper.host.processes import children_of
        for _ in range(50):
            Trouper(home=home).close()
        zombies = [pid for pid in children_of(os.getpid())
                   if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0] == "Z"]
        print("zombies", len(zombies), "children", len(children_of(os.getpid())), flush=True)
    """, mark)
    out, err = program.communicate(timeout=600)
    assert program.returncode == 0, err.decode()[-2000:]
    assert out.decode().split() == ["zombies", "0", "children", "0"]
    # nothing on the program's stderr: an exiting actor once left Thespian watching its
    # closed worker pipe, and epoll failed (EPERM) on the reused number in ~1 of 12 closes
    assert "Traceback" not in err.decode(), err.decode()[-3000:]
    wait_until(lambda: _marked(mark) == [], 10, f"leftover processes: {_marked(mark)}")


def test_an_admin_port_taken_before_the_admin_binds_it_is_replaced(tmp_path, monkeypatch,
                                                                   caplog):
    """free_port() closes the port it found; another program may listen there before the
    admin binds it (seen once in a loaded suite: a daemon failed to start). The open
    tries another port instead of failing."""
    import socket

    from thespian.system import systemBase

    from trouper import Trouper
    from trouper.client import actor_system

    patience = (systemBase.MAX_SYSTEM_SHUTDOWN_DELAY, systemBase.MAX_ADMIN_STATUS_REQ_DELAY)

    def port_then_real() -> int:
        """The taken port first, with Thespian told to give up on it soon: it probes a
        squatter that never answers for 11 s + 2 s per query, the same failure later;
        Thespian's own patience again for every port after it (the open that succeeds)."""
        if not handed:
            handed.append(taken)
            systemBase.MAX_SYSTEM_SHUTDOWN_DELAY = timedelta(0)
            systemBase.MAX_ADMIN_STATUS_REQ_DELAY = timedelta(seconds=0.2)
            return taken
        systemBase.MAX_SYSTEM_SHUTDOWN_DELAY, systemBase.MAX_ADMIN_STATUS_REQ_DELAY = patience
        return real()

    handed: list[int] = []
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        real = actor_system.free_port
        monkeypatch.setattr(actor_system, "free_port", port_then_real)
        # Thespian's patience is back however the open ends (undo runs before teardown)
        monkeypatch.setattr(systemBase, "MAX_SYSTEM_SHUTDOWN_DELAY", patience[0])
        monkeypatch.setattr(systemBase, "MAX_ADMIN_STATUS_REQ_DELAY", patience[1])
        with caplog.at_level("WARNING", logger="trouper.client.actor_system"):
            with Trouper(home=tmp_path / "home") as trouper:
                assert trouper.sessions() == []
    assert handed == [taken]
    assert f"the admin port {taken} was taken before the admin bound it" in caplog.text


def test_close_reaps_the_admins_first_fork_even_when_it_exits_late(tmp_path):
    """The admin's first fork exits once it has forked the admin; on a busy machine a close
    right after the open came before that, and the fork stayed the program's zombie (the
    open/close cycles above, 1 run in 3 of the suite)."""
    from trouper import Trouper

    t = Trouper(home=tmp_path / "home")
    late = os.fork()
    if late == 0:  # a first fork that is slow to exit, as under load
        time.sleep(0.3)
        os._exit(0)
    t._system._forks.append(late)  # noqa: SLF001 - the handle's own list of them
    t.close()
    with pytest.raises(ChildProcessError):  # reaped by the close: no child of ours now
        os.waitpid(late, os.WNOHANG)
