"""Small facts about local processes, read from the kernel (Linux ``/proc``)."""

from __future__ import annotations

import functools
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any


def stat_fields(pid: int | str) -> list[str]:
    """``/proc/PID/stat`` after the command name (state, parent pid, ...; ``proc(5)``
    numbers them from 3); empty when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()
    except OSError:
        return []


def parent_of(pid: int) -> int | None:
    """``pid``'s parent, or None when it is gone."""
    fields = stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie nobody reaped yet counts as dead."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def children_of(pid: int) -> list[int]:
    """The pids whose parent is ``pid``: from each of its threads' ``children`` file
    (one small read per thread), else (a kernel without them) a pass over ``/proc``."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: set[int] = set()
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as children:
                found.update(int(c) for c in children.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return _children_by_scan(pid)  # the kernel keeps no children files
        except (OSError, ValueError):
            continue
    return sorted(found)


def _children_by_scan(pid: int) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and parent_of(int(entry)) == pid]


def children_map() -> dict[int, list[int]]:
    """Parent pid -> the pids of its live children, for every process: one pass over
    ``/proc`` (``children_of`` reads it all for one parent)."""
    below: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields and fields[0] not in ("Z", "X"):
            below.setdefault(int(fields[1]), []).append(int(entry))
    return below


def descendants(roots: Iterable[int], children: dict[int, list[int]] | None = None
                ) -> list[int]:
    """``roots`` that live and every process below them (``children``: a ``children_map``
    already read, for several walks over one snapshot)."""
    below = children_map() if children is None else children
    found: list[int] = []
    todo = [pid for pid in roots if pid_alive(pid)]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.append(pid)
            todo.extend(below.get(pid, []))
    return found


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, names one process for
    good, where a pid alone may be reused (``pid_max`` is 32768 on many machines)."""
    fields = stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else None


def session_members(sid: int) -> dict[int, int]:
    """The live processes of the session ``sid`` (its leader included), each with its
    start time (``end_processes`` then ends those very processes, never a reused pid)."""
    found = {}
    for entry in os.listdir("/proc"):
        fields = stat_fields(entry) if entry.isdigit() else []
        if len(fields) > 19 and fields[3] == str(sid) and fields[0] not in ("Z", "X"):
            found[int(entry)] = int(fields[19])
    return found


def end_processes(known: dict[int, int], wait_s: float) -> list[int]:
    """SIGKILL each process of ``known`` (pid -> start time) still running as itself and
    wait up to ``wait_s`` for all to be gone; the pids still there after it."""
    def left() -> list[int]:
        return [pid for pid, started in known.items()
                if pid_alive(pid) and start_time(pid) == started]

    for pid in left():
        signal_quietly(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while (remaining := left()) and time.monotonic() < deadline:
        time.sleep(0.01)  # a poll interval: the condition is their exit, just above
    return remaining


def published_pid(path: os.PathLike[str] | str) -> int | None:
    """The pid an actor published at ``path`` (``pid start_time``, ``TrouperActor.
    publish_pid``) if that process still runs; None otherwise (no file, or the pid now
    names another process)."""
    try:
        with open(path, encoding="utf-8") as published:
            pid_text, _, started_text = published.read().partition(" ")
        pid, started = int(pid_text), int(started_text.split()[0] if started_text.strip() else 0)
    except (OSError, ValueError):
        return None
    if started and start_time(pid) != started:
        return None  # that incarnation is gone and its pid went to another process
    return pid if pid_alive(pid) else None


def listening_sockets() -> dict[str, tuple[str, int]]:
    """Every listening TCP socket on the machine: inode -> (local address hex, port).

    The address is as ``/proc/net/tcp`` spells it (``0100007F`` is 127.0.0.1).
    """
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                lines = rows.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A":  # LISTEN
                address, port = cols[1].rsplit(":", 1)
                found[cols[9]] = (address, int(port, 16))
    return found


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets ``pid`` holds open (as ``listening_sockets`` keys them)."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def exit_watch(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux pidfd, close it after
    use); None when the kernel or Python has none, or the process is gone."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def is_bash(pid: int) -> bool:
    """Whether ``pid`` runs bash (its command line says so)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"bash" in cmdline.read()
    except OSError:
        return False


def process_name(pid: int) -> str:
    """``/proc/<pid>/comm`` (what ``name_process`` set), or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def lock_holder(path: os.PathLike[str] | str) -> int | None:
    """The pid holding an exclusive ``flock`` on ``path`` (read from ``/proc/locks``), or
    None: nobody holds one, the file is gone, or this kernel does not say."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (a waiter's line has "->")
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "WRITE" \
                and fields[5] == where and fields[4].isdigit():
            return int(fields[4])
    return None


def current_umask() -> int:
    """This process's umask, read without setting it (another thread may create files)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o077


def signal_quietly(pid: int, signum: int) -> None:
    """``os.kill`` that ignores a process already gone (or not ours)."""
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def process_group(pid: int) -> int | None:
    """The process group of ``pid``; None once it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@functools.cache
def libc() -> Any:
    """The C library through ctypes (``errno`` kept), or None where it cannot be loaded.
    Loaded once: called before the first fork, every actor shares it rather than each
    building ctypes' classes for its own."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None


def name_process(name: str) -> None:
    """Set this process's name as ``ps``, ``top`` and ``/proc/<pid>/comm`` show it (Linux,
    at most 15 bytes; elsewhere nothing): a forked actor otherwise shows its program's."""
    try:
        libc().prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except AttributeError:  # no libc, or no prctl in it
        pass


_PR_SET_NAME = 15


def die_if_forked(owner_pid: int, signum: int) -> bool:
    """In a signal handler: if this process is not ``owner_pid`` but was forked from it
    before it set handlers of its own (an actor), die as the signal means, rather than act
    as the owner would. False in the owner itself."""
    if os.getpid() == owner_pid:
        return False
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return True


@contextmanager
def signal_handlers(signums: Iterable[int], handler: Callable[[int, Any], None]
                    ) -> Iterator[None]:
    """``handler`` for each of ``signums`` inside the block; the previous ones after it."""
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


class SignalRelay:
    """Does, on a thread of its own, what a signal handler must not do itself.

    A Python signal handler runs in the main thread between two bytecodes, wherever that
    thread is: setting a ``threading.Event`` there deadlocks when the signal lands while
    the main thread holds the event's lock (inside ``Event.wait``, say), and the program
    hangs for good. ``fire()`` only writes a byte to a pipe (no lock); the relay thread
    reads it and calls ``action``. Use as a context manager around the handlers.
    """

    def __init__(self, action: Callable[[], None]) -> None:
        self._action = action
        self._read_fd, self._write_fd = -1, -1
        self._thread: threading.Thread | None = None
        self._fired = False

    def __enter__(self) -> SignalRelay:
        self._read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._relay, name="signal-relay", daemon=True)
        self._thread.start()
        return self

    def fire(self) -> None:
        """From a signal handler: have ``action`` called (once, on the relay thread)."""
        self._fired = True
        try:
            os.write(self._write_fd, b"!")
        except OSError:  # the relay has ended: the block is over
            pass

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            os.write(self._write_fd, b".")  # wakes the relay if nothing fired
            self._thread.join(5.0)
        for fd in (self._read_fd, self._write_fd):
            os.close(fd)
        self._thread, self._read_fd, self._write_fd = None, -1, -1

    def _relay(self) -> None:
        os.read(self._read_fd, 1)
        if self._fired:
            self._action()


OPEN_FILES_CEILING = 1 << 20
"""The soft limit ``raise_open_file_limit`` sets when the hard one is unlimited."""


def raise_open_file_limit() -> None:
    """Raise this process's soft limit on open files to its hard limit (inherited by what
    it forks). A stock machine's soft limit (1,024) is far below what a process
    supervising hundreds of sessions holds."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):  # a platform that refuses: keep the limit it gave
            pass
