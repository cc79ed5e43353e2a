"""The parent process of ``forkserver``: imports trouper once, then forks each process a
test asks for and lets it become ``python -m ...``, ``python -c ...`` or ``python FILE``.

    python tests/accel/zygote.py FD [--listen LFD] [MODULE...]
    # FD: its end of the test process's socketpair; MODULE: what to import first
    # (``forkserver`` passes its PRELOAD)
    # LFD: a listening Unix socket (in an owner-only folder): each connection is a
    #      control like a child's, for pytest's workers (``forkserver.serve_workers``)

Each request on that socket is one JSON object (the command, environment, folder, the
target descriptor numbers) with its descriptors: first the reply socket, then one
descriptor per target (stdin, stdout, stderr, any ``pass_fds``). The zygote forks, answers
``{"pid": N}`` on the reply socket and, once it has reaped the child, ``{"exit": code}``
(negative for a signal, as ``subprocess`` says). The child puts its descriptors in place,
takes the environment, folder, session and SIGINT disposition it was given, and runs the
command as the interpreter would, so it exits as that command would: with its
``SystemExit`` code, 1 and a traceback for an uncaught error, by SIGINT for an uncaught
``KeyboardInterrupt``. It waits for its threads and runs its ``atexit`` handlers, then
ends with ``os._exit``: the interpreter's own teardown, which would copy most of the
pages it shares with the zygote, is skipped.

Only the test process holds the other end of the pair, and the zygote dies with it
(``PR_SET_PDEATHSIG``); when the test process closes its end, the zygote takes no more
requests and exits once it has reported its last child's exit. Each child gets a pair of
its own, so that what it starts through ``forkserver`` (a bench run's daemons) is forked
here too. The one listening socket is pytest's, for its workers (``--listen``): a Unix
socket in a folder only its owner can enter, closed with the test process's pair.
"""

from __future__ import annotations

import ctypes
import faulthandler
import fcntl
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import types
from typing import Any

MAX_REQUEST = 1 << 20
MAX_FDS = 64
_PR_SET_PDEATHSIG = 1
STACKS_SIGNAL = signal.SIGUSR2
"""Makes a forked process write every thread's Python stack to its stderr."""
_DEFERRED = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}


class Job:
    """One request, in the forked child: what to become."""

    def __init__(self, request: dict[str, Any], fds: list[int], control: int) -> None:
        self.argv: list[str] = request["argv"]
        self.env: dict[str, str] = request["env"]
        self.cwd: str = request["cwd"]
        self.targets: list[int] = request["targets"]
        self.new_session: bool = request["new_session"]
        self.sigint_ignored: bool = request["sigint_ignored"]
        self.cgroup: str | None = request.get("cgroup")
        self.fds = fds
        self.control = control
        """The child's own socket to the zygote (``forkserver`` uses it for what it forks)."""


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    args = sys.argv[2:]
    listener = None
    if args[:1] == ["--listen"]:
        listener = socket.socket(fileno=int(args[1]))
        args = args[2:]
    _die_with_parent()
    for name in args:
        importlib.import_module(name)
    if "trouper.client.actor_system" in sys.modules:  # a test's program calls models: preloaded
        importlib.import_module("trouper.llm.client").preload_first_call()
    if threading.active_count() != 1:  # a fork would copy a thread's locks, not the thread
        raise SystemExit(f"zygote: an import started threads: {threading.enumerate()}")
    gc.freeze()  # the children's collector never writes to what they share
    control.send(b"ready")
    job = _serve(control, listener)  # returns only in a forked child
    _become(job)
    _exit_without_teardown(_outcome(job.argv))


def _outcome(argv: list[str]) -> int:
    """Run the command; its exit status as the interpreter would give it (an uncaught
    KeyboardInterrupt still propagates: the interpreter then dies by SIGINT)."""
    try:
        _run(argv)
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code & 0xFF
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - reported as the interpreter would
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit_without_teardown(code: int) -> None:
    """Exit as the interpreter does (wait for threads, run atexit, flush) but skip its
    teardown of every module and object: in a child forked from this zygote that walk
    touches, and so copies, most inherited pages: ~0.11 s of CPU per process."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
    finally:
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _serve(control: socket.socket, listener: socket.socket | None) -> Job:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    replies: dict[int, socket.socket] = {}
    controls = [control]  # the test process's, then one per child: its own requests
    taking = True
    while taking or replies:
        listening = [listener] if listener is not None else []
        readable, _, _ = select.select([*controls, *listening, wake_r] if taking else [wake_r],
                                       [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(replies)
        if listener is not None and listener in readable:
            try:
                controls.append(listener.accept()[0])
            except OSError:  # the connecting worker gave up meanwhile
                pass
        for source in [c for c in controls if c in readable]:
            data, fds, _, _ = socket.recv_fds(source, MAX_REQUEST, MAX_FDS)
            if not data:  # the test process closed its end: report the last exits, go
                taking = taking and source is not control
                controls.remove(source)
                source.close()
                if not taking and listener is not None:
                    listener.close()
                    listener = None
                continue
            reply = socket.socket(fileno=fds[0])
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            # a signal sent to the child before it has its own handlers waits for them (a
            # SIGINT would otherwise raise KeyboardInterrupt in the zygote's code)
            signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for sock in (*controls, *listening, reply, ours, *replies.values()):
                    sock.close()
                os.close(wake_r)
                os.close(wake_w)
                return Job(json.loads(data), fds[1:], theirs.detach())
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _DEFERRED)
            theirs.close()
            controls.append(ours)
            for fd in fds[1:]:
                os.close(fd)
            try:
                reply.send(json.dumps({"pid": pid}).encode())
            except OSError:  # the asker died meanwhile (a forked bench killed, say)
                pass
            replies[pid] = reply
            _reap(replies)  # a child that ended before it was filed
    raise SystemExit(0)


def _reap(replies: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reply = replies.pop(pid, None)
        if reply is not None:
            try:
                reply.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
            except OSError:
                pass  # nobody waits for it any more
            reply.close()


def _become(job: Job) -> None:
    """Put the descriptors, session, folder, environment and signals in place."""
    if job.cgroup:  # first: whatever it starts from here on is in the group too
        from trouper.testing.cgroups import join_cgroup

        join_cgroup(job.cgroup)
    floor = max([*job.targets, *job.fds, job.control]) + 1  # no dup2 overwrites a source
    lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in job.fds]
    control = fcntl.fcntl(job.control, fcntl.F_DUPFD_CLOEXEC, floor)
    for fd in [*job.fds, job.control]:
        os.close(fd)
    for fd, target in zip(lifted, job.targets, strict=True):
        os.dup2(fd, target)
    for fd in lifted:
        os.close(fd)
    from . import forkserver

    forkserver.inherit_zygote(control)
    if job.new_session:
        os.setsid()
    os.chdir(job.cwd)
    os.environ.clear()
    os.environ.update(job.env)
    signal.signal(signal.SIGINT,
                  signal.SIG_IGN if job.sigint_ignored else signal.default_int_handler)
    unbuffered = bool(job.env.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=os.isatty(1), write_through=unbuffered)
    sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)
    # a test that waited too long for this process asks it where it is (``dump_stacks``)
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _DEFERRED)


def _run(argv: list[str]) -> None:
    """Run ``argv`` (what follows ``python``) as the interpreter would run it."""
    sys.excepthook = _without_zygote_frames
    while argv[0] in ("-u", "-B"):  # the flags execnet gives pytest's workers
        if argv[0] == "-u":
            sys.stdout.reconfigure(write_through=True)
            sys.stderr.reconfigure(write_through=True)
        else:
            sys.dont_write_bytecode = True
        argv = argv[1:]
    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = module
        exec(compile(argv[1], "<string>", "exec"), module.__dict__)  # noqa: S102
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def _without_zygote_frames(kind: type[BaseException], error: BaseException,
                           tb: types.TracebackType | None) -> None:
    """An uncaught error's traceback from the command's first frame, as if started."""
    frame = tb
    while frame is not None and frame.tb_frame.f_code is not _run.__code__:
        frame = frame.tb_next
    trimmed = frame.tb_next if frame is not None else tb
    sys.__excepthook__(kind, error.with_traceback(trimmed), trimmed)  # it prints the error's


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        raise SystemExit("zygote: the test process is gone")


if __name__ == "__main__":
    # started by path: run as ``accel.zygote``, from ``tests/``, so that ``_become`` hands
    # the child its socket in ``accel.forkserver``, the module the suite's processes import
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from accel.zygote import main as accel_main

    accel_main()
