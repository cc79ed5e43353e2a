"""What every process Thespian forks for trouper does first, and what a new system cleans up.

Thespian forks its admin from the program that opens an actor system (then the admin
double-forks and calls ``setsid``), and every actor from its parent. ``install`` wraps
the two entry points (``multiprocCommon.startAdmin`` and ``startChild``, looked up by name
when Thespian forks) so that each forked process, before Thespian runs:

- lets go of the sockets and pipes it inherited (``release_inherited_descriptors``): a
  listening socket of the program, a pipe it reads to EOF;
- creates files owner-only from then on (umask 077, ``paths.enter_private_process``);
- records its metrics to files of its own in ``<home>/metrics/`` (``observability/``: the
  program that serves them sums the folder; the admin empties or compacts it first).

The admin also raises its soft limit on open files to the hard one
(``processes.raise_open_file_limit``), so every actor it forks has it: the root holds
descriptors for each session process it supervises, the broker a socket for each
session and its model connections, and a stock soft limit (1,024) made the root's forks
fail with EMFILE past a few hundred sessions. The sandboxes are forked by their own
zygote, from the program, and keep the program's limit, as the commands in them do.

The admin also publishes ``<home>/actors/admin.pid`` (its pid, start time, and the
embedding program's) and, in an embedded system, watches that program from its first
instant: when it is gone, the admin kills its process group (itself, the logger and every
actor). Without that, a program killed before the root actor booted left the admin and
logger running for ever. ``end_orphans`` is the second line: a new system on the same home
ends the group of an admin whose program is dead.
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import multiprocessing
import os
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from thespian.system import multiprocCommon

from ..config.settings import settings
from ..home.paths import enter_private_process, write_private
from ..host.processes import (
    exit_watch,
    libc,
    name_process,
    pid_alive,
    raise_open_file_limit,
    start_time,
)
from ..observability import metrics
from ..runtimes import sandbox_zygote
from . import reaping

logger = logging.getLogger(__name__)

ADMIN_PORT_IN_USE = 98
"""The exit status of an admin whose port another program bound first (EADDRINUSE)."""

_next_admin: dict[str, Any] = {"home": None, "owner_pid": 0}
"""Read in the forked admin: what the opening ``ActorSystemHandle`` set just before."""


def install() -> None:
    """Wrap Thespian's fork entries and make it report every dead child (``reaping``);
    idempotent. Raises RuntimeError if they are gone."""
    reaping.install()
    libc()  # loaded once, here: the actors share it
    _has_setproctitle[0] = importlib.util.find_spec("setproctitle") is not None
    for name in ("startAdmin", "startChild"):
        entry = getattr(multiprocCommon, name, None)
        if entry is None:
            raise RuntimeError(f"thespian.system.multiprocCommon.{name} is missing")
        if not getattr(entry, "_trouper_entry", False):
            setattr(multiprocCommon, name, _entry(entry, admin=name == "startAdmin"))


def prepare_admin(home: Path, owner_pid: int) -> None:
    """Say where the next admin forked from this process publishes itself, and whom it
    watches (0: nobody, the system outlives its program)."""
    _next_admin["home"], _next_admin["owner_pid"] = home, owner_pid


_has_setproctitle = [True]
"""Whether the optional ``setproctitle`` is installed (found once, before any fork)."""


def _entry(target: Callable[..., Any], admin: bool) -> Callable[..., Any]:
    def entry(*args: Any, **kwargs: Any) -> Any:
        release_inherited_descriptors()
        enter_private_process()
        metrics.enable_in_actor(_next_admin["home"], opening=admin)  # observability/folder.py
        if not _has_setproctitle[0]:
            # Thespian tries to import it in every actor; a miss searches all of sys.path
            sys.modules.setdefault("setproctitle", None)  # type: ignore[arg-type]
        if admin:
            raise_open_file_limit()
            _become_admin()
            try:
                return target(*args, **kwargs)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                # its port was taken after the program chose it: the program logs it and
                # opens on another (actor_system.ADMIN_PORT_TRIES); nothing on its stderr
                os._exit(ADMIN_PORT_IN_USE)
        return target(*args, **kwargs)

    entry._trouper_entry = True  # type: ignore[attr-defined]
    entry.__wrapped__ = target  # type: ignore[attr-defined]
    return entry


def _become_admin() -> None:
    """Runs in the admin's first fork; Thespian then calls setsid and forks again, so
    the watcher starts in the grandchild (the admin proper) through ``os.register_at_fork``."""
    owner = int(_next_admin["owner_pid"])
    owner_start = start_time(owner) if owner else None
    home = _next_admin["home"]

    def in_admin() -> None:
        name_process("trouper-admin")
        if home is not None:
            publish(Path(home) / "actors" / "admin.pid", owner, owner_start)
        if owner:
            threading.Thread(target=_watch_owner, args=(owner, owner_start),
                             name="trouper-owner-watch", daemon=True).start()

    state = {"forked": False}

    def after_fork_in_child() -> None:
        if not state["forked"]:  # only the admin proper, not the logger or actors it forks
            state["forked"] = True
            in_admin()

    os.register_at_fork(after_in_child=after_fork_in_child)


def publish(path: Path, owner_pid: int = 0, owner_start: int | None = None) -> None:
    """``pid start_time owner_pid owner_start_time`` of this process, owner-only."""
    pid = os.getpid()
    try:
        write_private(path, f"{pid} {start_time(pid) or 0} {owner_pid} {owner_start or 0}")
    except OSError as exc:
        logger.warning("could not publish pid %d to %s: %s", pid, path, exc)


def _watch_owner(owner: int, owner_start: int | None) -> None:
    exit_fd = exit_watch(owner)  # opened, then checked: it is the owner, not a reused pid
    if exit_fd is not None and _same_process(owner, owner_start):
        waiter = select.poll()  # poll, not select: no limit on the descriptor's number
        waiter.register(exit_fd, select.POLLIN)
        waiter.poll()  # wakes only when the owner exits: no polling
    while _same_process(owner, owner_start):  # no pidfd here: ask now and then
        time.sleep(settings().owner_check_s)
    logging.getLogger(__name__).warning(
        "the program (pid %d) that embeds this actor system is gone; taking the system "
        "down with it", owner)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _same_process(pid: int, started: int | None) -> bool:
    return pid_alive(pid) and (started is None or start_time(pid) == started)


def await_admin_exit(home: Path, timeout_s: float) -> None:
    """After a shutdown, wait (at most ``timeout_s``) until the admin this process owns has
    exited: a program that exits first has its admin's owner watch report it gone."""
    try:
        pid, started, owner, _ = (int(f) for f in
                                  (home / "actors" / "admin.pid").read_text().split())
    except (OSError, ValueError):
        return
    if owner != os.getpid():
        return
    exit_fd = exit_watch(pid)
    if exit_fd is None:
        return
    try:
        if _same_process(pid, started):
            waiter = select.poll()
            waiter.register(exit_fd, select.POLLIN)
            waiter.poll(int(timeout_s * 1000))
    finally:
        os.close(exit_fd)


def end_orphans(home: Path) -> list[int]:
    """Kill the process group of an admin on ``home`` whose program is dead; returns the
    admin pids ended. A live program's system (another Trouper on the home) is left."""
    path = home / "actors" / "admin.pid"
    try:
        fields = [int(f) for f in path.read_text().split()]
    except (OSError, ValueError):
        return []
    if len(fields) != 4:
        return []
    pid, started, owner, owner_started = fields
    if not owner or not _same_process(pid, started):
        return []
    if _same_process(owner, owner_started or None):
        return []
    logger.warning("ending the actor system (admin pid %d) of a program (pid %d) that died "
                   "without closing it", pid, owner)
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)  # the admin's group: logger and actors
    except OSError as exc:
        logger.warning("could not end process group %d: %s", pid, exc)
        return []
    return [pid]


def release_inherited_descriptors() -> None:
    """In a freshly forked process: let go of the sockets and pipes it inherited.

    Each is pointed at ``/dev/null`` rather than closed: the forking program's objects that
    still name those numbers (a socket the collector may finalise later) then close
    ``/dev/null``, never a socket this process opens afterwards under a reused number. What
    they held (a listening socket of the program, a pipe whose reader waits for EOF) is
    released. Kept: stdout and stderr (a crashing process's last words), multiprocessing's
    sentinel, and every file, folder and device: SQLite's per-process table of open
    databases survives the fork, and a connection the child opens later takes its locks
    through the descriptors it inherited, so pointing those at ``/dev/null`` would make
    its locks fake and let two writers overwrite each other's commits in the WAL. Kept
    too: the channel to the sandbox zygote (``runtimes/sandbox_zygote.py``).
    """
    keep = {1, 2}
    zygote = sandbox_zygote.channel_fd()
    if zygote is not None:
        keep.add(zygote)
    sentinel = getattr(multiprocessing.parent_process(), "_sentinel", None)
    if isinstance(sentinel, int):
        keep.add(sentinel)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in _open_descriptors():
        if fd not in keep and fd != devnull and _is_channel(fd):
            try:
                os.dup2(devnull, fd)
            except OSError:
                pass
    os.close(devnull)


def _is_channel(fd: int) -> bool:
    """A socket or a pipe: what another process may be waiting on or connecting to."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode)


def _open_descriptors() -> list[int]:
    """This process's descriptor numbers (a closed one fails ``_is_channel``'s fstat)."""
    try:
        return sorted(int(name) for name in os.listdir("/proc/self/fd"))
    except OSError:
        return list(range(1024))
