"""Whichever way a daemon ends (SIGTERM, SIGKILL, a crash, a SIGKILL of its process group),
none of the processes it started outlives it, but for what the docs allow: a session's
local sandbox server (and the shell and command in it), left so that a daemon started
again re-attaches to it, which ends by itself once idle (``sandbox_idle_timeout_s``).

Every process of the daemon is recorded while a session works (a command running in its
sandbox): by the cgroup the daemon is started in where one can be made (root), and by its
tree (its descendants and the members of its actor system's process session) anyway. A
process is named by its pid and start time, so a recycled pid is never taken for it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trouper.daemon.files import lock_is_held
from trouper.home.paths import Home
from trouper.host.processes import (
    children_map,
    descendants,
    end_processes,
    parent_of,
    pid_alive,
    process_name,
    published_pid,
    session_members,
    start_time,
    stat_fields,
)
from trouper.testing import wait_until
from trouper.testing.cgroups import join_cgroup, new_cgroup, remove_cgroup
from trouper.testing.daemon import TestDaemon

from accel import forkserver

pytestmark = pytest.mark.slow  # starts a daemon process, its actors and a sandbox

IDLE_S = 10.0
"""The sandbox servers' idle timeout in these daemons (``TROUPER_SANDBOX_IDLE_TIMEOUT_S``):
short, so a test sees a left server end by itself."""

DEADLINE_S = 30.0
"""How long the daemon's actor-system processes may take to go once the daemon is gone."""

ACTOR_SYSTEM = ("trouper-admin", "trouper-root", "trouper-llm", "trouper-session",
                "trouper-ctl", "trouper-proxy", "trouper-zygote")
"""The names of the processes that must never outlive the daemon (docs/operations.md,
"Processes"); each is present while a session works, or the test proves nothing."""

SANDBOX = "trouper-sandbox"

CRASH_ON_SIGUSR1 = """
import os, runpy, signal, sys
signal.signal(signal.SIGUSR1, lambda *_: os._exit(70))  # a crash from inside: no cleanup
sys.argv[0] = "trouper"
runpy.run_module("trouper", run_name="__main__", alter_sys=True)
"""
"""The daemon's command with a way to ``os._exit`` from inside it (its own code does not
handle SIGUSR1, so the handler set here stays)."""

Process = tuple[int, int]
"""A process for good: (pid, start time)."""


def _starter(cgroup: Path | None, crash_hook: bool, started: list[Any], forked: bool = True
             ) -> Callable[..., Any]:
    """``TestDaemon``'s ``popen``: the suite's fork server's (``forked``, else a process
    started afresh), in ``cgroup``, keeping the process object (for its exit status); with
    ``crash_hook``, the command above."""
    def popen(args: list[str], **kwargs: Any) -> Any:
        if crash_hook:
            assert args[1:3] == ["-m", "trouper"], args
            args = [args[0], "-c", CRASH_ON_SIGUSR1, *args[3:]]
        if forked:
            proc = forkserver.Popen(args, cgroup=cgroup, **kwargs)
        else:
            join = functools.partial(join_cgroup, cgroup) if cgroup is not None else None
            proc = subprocess.Popen(args, preexec_fn=join, **kwargs)  # noqa: PLW1509
        started.append(proc)
        return proc

    return popen


def _same(process: Process) -> bool:
    """Whether ``process`` still runs as itself (a zombie does not run)."""
    pid, started = process
    return pid_alive(pid) and start_time(pid) == started


def _zombie(process: Process) -> bool:
    fields = stat_fields(process[0])
    return len(fields) > 19 and fields[0] == "Z" and int(fields[19]) == process[1]


def _tree(daemon_pid: int, home: Home, cgroup: Path | None) -> dict[Process, str]:
    """Every live process the daemon started (the daemon too) -> its name."""
    pids = set(descendants([daemon_pid]))
    pids.update(_members(cgroup))
    admin = published_pid(home.root / "actors" / "admin.pid")
    if admin is not None:
        with contextlib.suppress(ProcessLookupError):  # the actors: setsid'd by the admin
            pids.update(session_members(os.getsid(admin)))
    pids.update(descendants(list(pids)))
    found = {}
    for pid in pids:
        started = start_time(pid)
        if started is not None and pid_alive(pid) and pid != os.getpid():
            found[(pid, started)] = process_name(pid)
    return found


def _allowed(tree: dict[Process, str]) -> set[Process]:
    """What may outlive the daemon: the sandbox servers and what runs in them."""
    below = children_map()
    servers = [pid for (pid, _), name in tree.items() if name == SANDBOX]
    kept = set(descendants(servers, below))
    return {process for process in tree if process[0] in kept}


def _zombies_held(tree: dict[Process, str]) -> list[str]:
    """Zombies among ``tree`` whose parent is still one of ``tree``'s (nothing of ours
    reaps them)."""
    ours = {pid for pid, _ in tree if pid_alive(pid)}
    return [f"{tree[p]} {p[0]} (parent {parent_of(p[0])})" for p in tree
            if _zombie(p) and parent_of(p[0]) in ours]


def _left(tree: dict[Process, str], skip: set[Process], cgroup: Path | None) -> list[str]:
    """What of ``tree`` (but ``skip``) still runs, or is a zombie of ours, and what runs
    in ``cgroup`` that was not there when ``tree`` was read (started by the ending);
    [] when none."""
    running = [f"{name} {pid}" for (pid, started), name in tree.items()
               if (pid, started) not in skip and _same((pid, started))]
    late = [f"{process_name(pid)} {pid} (started late)" for pid in _members(cgroup)
            if (pid, start_time(pid)) not in tree and pid_alive(pid)]
    return running + late + _zombies_held(tree)


def _members(cgroup: Path | None) -> list[int]:
    if cgroup is None:
        return []
    return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]


@contextlib.contextmanager
def _daemon(tmp_path: Path, crash_hook: bool, start: bool = True, forked: bool = True
            ) -> Iterator[tuple[TestDaemon, list[Any], Path | None, dict[Process, str]]]:
    """A daemon (in a cgroup of its own where one can be made), started unless ``start``
    is False (``forked`` from the suite's fork server, else afresh), the list its process
    object goes in, its cgroup and the processes the test
    records of it; at the end, everything it started is gone, whatever the test did."""
    cgroup = new_cgroup(f"trouper-test-ends-{uuid.uuid4().hex[:12]}")
    started: list[Any] = []
    env = {"TROUPER_SANDBOX_IDLE_TIMEOUT_S": str(IDLE_S),
           "TROUPER_SANDBOX_WATCHED_HEALTH_EVERY_S": str(IDLE_S / 4)}
    daemon = TestDaemon(tmp_path / "home", env=env,
                        popen=_starter(cgroup, crash_hook, started, forked))
    seen: dict[Process, str] = {}
    try:
        if start:
            daemon.start()
        yield daemon, started, cgroup, seen
    finally:
        with contextlib.suppress(Exception):
            if started and started[0].poll() is None:
                seen.update(_tree(started[0].pid, daemon.home, cgroup))
        with contextlib.suppress(Exception):
            daemon.close()  # stops a running daemon, then the sandboxes of the home
        if cgroup is not None:
            for _ in range(3):
                members = {pid: start_time(pid) or 0 for pid in _members(cgroup)}
                if not members:
                    break
                end_processes(members, 10)
            remove_cgroup(cgroup, 30)
        end_processes({pid: started for pid, started in seen}, 10)


def _session_at_work(daemon: TestDaemon, scripted: Any) -> str:
    """A session whose sandbox runs a long command; returns its id once its Controller,
    RuntimeProxy and supervisor, the root and the broker have published their pids."""
    _, llm = scripted([{"tool": "run", "args": {"command": "sleep 600"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    session = daemon.client().start_session("wait", llm=llm, max_iterations=5)
    home = daemon.home

    def at_work() -> bool:
        roles = [home.actor_pid_path("root"), home.actor_pid_path("broker"),
                 home.actor_pid_path("session", session.id),
                 home.actor_pid_path("controller", session.id),
                 home.actor_pid_path("runtime", session.id)]
        return (all(published_pid(path) is not None for path in roles)
                and daemon.client().session(session.id).info().actions >= 1)

    wait_until(at_work, 120, "the session's actors at work on its command")
    return session.id


def _sleeping(tree: dict[Process, str]) -> bool:
    return any(name == "sleep" for name in tree.values())


ENDINGS: dict[str, tuple[Callable[[Any], None], int]] = {
    # how it is ended -> the daemon's exit status (that ending, not another, ended it)
    "sigterm": (lambda proc: os.kill(proc.pid, signal.SIGTERM), 0),
    "sigkill": (lambda proc: os.kill(proc.pid, signal.SIGKILL), -signal.SIGKILL),
    "sigsegv": (lambda proc: os.kill(proc.pid, signal.SIGSEGV), -signal.SIGSEGV),
    "sigabrt": (lambda proc: os.kill(proc.pid, signal.SIGABRT), -signal.SIGABRT),
    "os_exit": (lambda proc: os.kill(proc.pid, signal.SIGUSR1), 70),
    "group_sigkill": (lambda proc: os.killpg(os.getpgid(proc.pid), signal.SIGKILL),
                      -signal.SIGKILL),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_no_process_of_a_daemon_outlives_it_but_its_sandboxes(tmp_path: Path, scripted: Any,
                                                               ending: str) -> None:
    with _daemon(tmp_path, crash_hook=ending == "os_exit") as (daemon, procs, cgroup, seen):
        proc = procs[0]
        _session_at_work(daemon, scripted)
        tree = wait_until(lambda: (t := _tree(proc.pid, daemon.home, cgroup)) and
                          _sleeping(t) and t, 60, "the sandbox's command in the tree")
        seen.update(tree)  # ended at the end, whatever happens
        names = set(tree.values())
        assert set(ACTOR_SYSTEM) | {SANDBOX} <= names, names
        allowed = _allowed(tree)
        assert {tree[p] for p in allowed} >= {SANDBOX, "sleep"}
        assert not {tree[p] for p in allowed} & set(ACTOR_SYSTEM)

        end, status = ENDINGS[ending]
        end(proc)
        assert proc.wait(60) == status
        if ending == "sigterm":  # a graceful stop: its lock freed as it exits
            assert not lock_is_held(daemon.files)
        try:
            wait_until(lambda: not _left(tree, allowed, cgroup), DEADLINE_S,
                       f"the daemon's processes to end after its {ending}")
            # what was left, the sandbox server, goes once idle; its command with it
            wait_until(lambda: not _left(tree, set(), cgroup), IDLE_S * 3 + DEADLINE_S,
                       "the sandbox to end once idle")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; still there: {_left(tree, set(), cgroup)}") from None


@pytest.mark.parametrize("role", ["controller", "runtime", "session"])
def test_a_stopped_daemon_leaves_no_actor_it_found_hung(tmp_path: Path, scripted: Any,
                                                      role: str) -> None:
    """SIGTERM while one of a session's actors hangs (SIGSTOPped): it cannot take part in
    the graceful close, and still does not outlive the daemon."""
    with _daemon(tmp_path, crash_hook=False) as (daemon, procs, cgroup, seen):
        proc = procs[0]
        sid = _session_at_work(daemon, scripted)
        tree = wait_until(lambda: (t := _tree(proc.pid, daemon.home, cgroup)) and
                          _sleeping(t) and t, 60, "the sandbox's command in the tree")
        seen.update(tree)
        allowed = _allowed(tree)
        hung = published_pid(daemon.home.actor_pid_path(role, sid))
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(120) == 0
        try:
            wait_until(lambda: not _left(tree, allowed, cgroup), DEADLINE_S,
                       f"the daemon's processes to end, its {role} hung")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; still there: {_left(tree, set(), cgroup)}") from None


@pytest.mark.parametrize("stage", ["admin", "root", "broker"])
def test_a_daemon_killed_while_starting_leaves_no_process(tmp_path: Path, stage: str) -> None:
    """SIGKILL as soon as its actor system's ``stage`` has published its pid, before the
    daemon answers: nothing of it stays."""
    # started afresh: the suite's fork server stopped forking after one daemon it forked
    # was killed this early (a matter of the test harness, not of trouper)
    with _daemon(tmp_path, crash_hook=False, start=False, forked=False
                 ) as (daemon, procs, cgroup, seen):
        starting = threading.Thread(target=_start_quietly, args=(daemon,), daemon=True)
        starting.start()
        published = daemon.home.actor_pid_path(stage)
        try:
            pid = wait_until(lambda: procs and published_pid(published), 120,
                             f"the starting daemon's {stage}")
        except TimeoutError as exc:
            log = daemon.files.log.read_text() if daemon.files.log.exists() else ""
            status = procs[0].poll() if procs else "not started"
            raise AssertionError(f"{exc} (daemon: {status}); its log: {log[-2000:]}") from None
        tree = _tree(procs[0].pid, daemon.home, cgroup)
        seen.update(tree)
        assert process_name(pid) in set(tree.values())
        os.kill(procs[0].pid, signal.SIGKILL)
        assert procs[0].wait(60) == -signal.SIGKILL
        starting.join(150)
        try:
            wait_until(lambda: not _left(tree, set(), cgroup), DEADLINE_S,
                       f"the daemon's processes to end after a SIGKILL at its {stage}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; still there: {_left(tree, set(), cgroup)}") from None


def _start_quietly(daemon: TestDaemon) -> None:
    """``daemon.start()``, which the test makes fail by killing the daemon."""
    with contextlib.suppress(Exception):
        daemon.start()
