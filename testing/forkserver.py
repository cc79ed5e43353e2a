"""Start ``python -m trouper ...`` processes in tests without paying their imports each time.

A fresh trouper process spends ~3.5 s of CPU importing trouper and litellm before it does
anything; a suite that starts dozens of them spends most of its CPU there. ``run`` and
``Popen`` here take the arguments of their ``subprocess`` namesakes and fork the process
from a zygote (``testing/zygote.py``) that imported all that once: a real process with its
own pid, descriptors, environment, folder, session and exit status, running the real
entry point, in a few milliseconds.

    from trouper.testing import forkserver
    done = forkserver.run([sys.executable, "-m", "trouper", "demo"], capture_output=True)
    proc = forkserver.Popen([sys.executable, "-m", "trouper", "run", ...],
                            start_new_session=True, sigint_ignored=True)

What differs from a started process: ``/proc/PID/cmdline`` and ``/proc/PID/environ`` show
the zygote's, and the modules in ``zygote.PRELOAD`` are already imported. An import may
read the environment, so a zygote serves only environments that differ from its own in
``RUNTIME_ENV`` (trouper's variables and the terminal size, read after start-up); another
gets a new zygote (the old one exits once its children have). A command that is not
``sys.executable`` with ``-m``, ``-c`` or a script goes to ``subprocess`` unchanged, and
so does everything when this process's environment has ``TROUPER_TEST_FORK=0``.
``sigint_ignored`` stands for a ``preexec_fn`` that sets SIGINT to SIG_IGN.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import locale
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from .cgroups import join_cgroup

FORK_ENV = "TROUPER_TEST_FORK"
RUNTIME_ENV = ("TROUPER_", "COLUMNS", "LINES", "PYTEST_CURRENT_TEST", "THESPIAN_BASE_IPADDR",
               "THESPLOG_FILE", "TIKTOKEN_CACHE_DIR")
"""What a forked process's environment may change from the zygote's: variables read after
start-up (pytest sets ``PYTEST_CURRENT_TEST`` for each test; opening an actor system sets
the Thespian two, importing litellm the last). Any other (``PYTHONPATH``, the many that
litellm reads on import) must match."""
START_TIMEOUT_S = 120.0


class ForkServer:
    """One zygote and the socket to it; safe to use from several threads."""

    def __init__(self, preload: Sequence[str] | None = None) -> None:
        """``preload``: the modules the zygote imports (default ``zygote.PRELOAD``)."""
        self._preload = None if preload is None else list(preload) or ["sys"]
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self._zygote: subprocess.Popen[bytes] | None = None
        self._retired: list[subprocess.Popen[bytes]] = []
        self._env: dict[str, str] = {}

    def accepts(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` is one the zygote can become (see the module's doc)."""
        if os.environ.get(FORK_ENV, "1") == "0" or len(argv) < 2 or argv[0] != sys.executable:
            return False
        if argv[1] in ("-m", "-c"):
            return len(argv) >= 3
        return not argv[1].startswith("-")

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None,
              targets: dict[int, int], new_session: bool, sigint_ignored: bool,
              cgroup: str | None = None) -> int:
        """Fork ``argv`` with ``targets`` (child descriptor -> this process's); returns the
        reply socket's descriptor once the pid is known (see ``ForkedProcess``)."""
        env = dict(os.environ if env is None else env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {"argv": list(argv[1:]), "env": env,
                   "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                   "targets": list(targets), "new_session": new_session,
                   "sigint_ignored": sigint_ignored, "cgroup": cgroup}
        try:
            with self._lock:
                control = self._started(env)
                socket.send_fds(control, [json.dumps(request).encode()],
                                [theirs.fileno(), *targets.values()])
        finally:
            theirs.close()
        return ours.detach()

    def close(self) -> None:
        """End the zygotes; one whose children still run is killed after 10 s (they run on,
        as a parent's children would, but their exit is no longer reported)."""
        with self._lock:
            zygotes = [*self._retired, *([self._zygote] if self._zygote else [])]
            self._retire()
            self._retired = []
        for zygote in zygotes:
            try:
                zygote.wait(10)
            except subprocess.TimeoutExpired:
                zygote.kill()
                zygote.wait(10)

    def _retire(self) -> None:
        """Stop the zygote taking requests; it exits once its last child is reaped."""
        if self._control is not None:
            self._control.close()  # the zygote reads EOF
        if self._zygote is not None:
            self._retired.append(self._zygote)
        self._control = self._zygote = None

    def _started(self, env: dict[str, str]) -> socket.socket:
        """A zygote that imported everything under ``env``'s start-up part: the current
        one (first, in a forked process, the zygote it came from), or a new one when that
        part changed (an import may have read it)."""
        if self._control is not None and _frozen_part(env) == _frozen_part(self._env):
            return self._control
        if self._control is None and self._preload is None and _inherited["fd"] is not None \
                and _frozen_part(env) == _frozen_part(os.environ):
            fd, _inherited["fd"] = _inherited["fd"], None  # the parent's zygote, once
            self._control, self._env = socket.socket(fileno=fd), dict(os.environ)
            return self._control
        self._retire()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._env = env
        zygote = subprocess.Popen(
            [sys.executable, "-m", "trouper.testing.zygote", str(theirs.fileno()),
             *(self._preload or [])],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env=env, start_new_session=True, cwd="/")
        theirs.close()
        ready, _, _ = select.select([ours], [], [], START_TIMEOUT_S)
        if not ready or ours.recv(16) != b"ready":
            ours.close()
            zygote.kill()
            zygote.wait()
            raise RuntimeError(f"the test zygote did not start (exit {zygote.returncode})")
        self._control, self._zygote = ours, zygote
        return ours


def _frozen_part(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that must be as they were when the zygote imported everything."""
    frozen = {k: v for k, v in env.items() if not k.startswith(RUNTIME_ENV)}
    if frozen.get("TZ") == ":/etc/localtime":  # the default, spelled out (by the browser's
        del frozen["TZ"]                       # tests' libraries): the same time zone
    return frozen


class ForkedProcess:
    """A process forked by the zygote, as much of ``subprocess.Popen`` as tests use."""

    def __init__(self, args: Sequence[str], server: ForkServer, *,
                 stdin: Any = None, stdout: Any = None, stderr: Any = None,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                 text: bool = False, start_new_session: bool = False,
                 sigint_ignored: bool = False, pass_fds: Sequence[int] = (),
                 cgroup: str | os.PathLike[str] | None = None) -> None:
        """``cgroup``: a cgroup folder the child joins before anything else, so that all it
        starts is found there (its ``/proc`` environment cannot mark them: it is the
        zygote's)."""
        self.args = list(args)
        self.returncode: int | None = None
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        self._text = text
        self._out: dict[str, list[bytes]] = {}
        self._readers: list[threading.Thread] = []
        self._exited = threading.Event()
        child: dict[int, int] = {}
        to_close: list[int] = []
        ours: dict[int, int] = {}
        for target, spec in ((0, stdin), (1, stdout), (2, stderr)):
            if spec == subprocess.STDOUT and target == 2:
                child[2] = child[1]
            elif spec == subprocess.PIPE:
                r, w = os.pipe()
                child[target], ours[target] = (r, w) if target == 0 else (w, r)
                to_close.append(child[target])
            elif spec == subprocess.DEVNULL:
                child[target] = os.open(os.devnull, os.O_RDWR)
                to_close.append(child[target])
            elif spec is None:
                child[target] = target
            else:
                child[target] = spec if isinstance(spec, int) else spec.fileno()
        for fd in pass_fds:
            child[fd] = fd
        try:
            reply_fd = server.spawn(args, env=env, cwd=cwd, targets=child,
                                    new_session=start_new_session,
                                    sigint_ignored=sigint_ignored,
                                    cgroup=os.fspath(cgroup) if cgroup else None)
        except BaseException:
            for fd in ours.values():
                os.close(fd)
            raise
        finally:
            for fd in to_close:
                os.close(fd)
        self._reply = socket.socket(fileno=reply_fd)
        answer = json.loads(self._reply.recv(4096) or b"{}")
        if "pid" not in answer:
            raise RuntimeError(f"the test zygote did not start {self.args!r}")
        self.pid: int = answer["pid"]
        threading.Thread(target=self._await_exit, daemon=True,
                         name=f"forked-{self.pid}").start()
        for target, fd in ours.items():
            self._wrap(target, fd)

    def _wrap(self, target: int, fd: int) -> None:
        raw: IO[Any] = open(fd, "wb" if target == 0 else "rb")  # noqa: SIM115 - owned here
        stream: IO[Any] = raw
        if self._text:
            stream = io.TextIOWrapper(raw, encoding=locale.getpreferredencoding(False),  # type: ignore[arg-type]
                                      write_through=target == 0)
        setattr(self, ("stdin", "stdout", "stderr")[target], stream)

    def _await_exit(self) -> None:
        answer = self._reply.recv(4096)
        self._reply.close()
        # no answer: the zygote died before the child (the test process is ending, or
        # close() killed a zygote whose children outlived its 10 s): the exit is unknown
        self.returncode = json.loads(answer)["exit"] if answer else -signal.SIGKILL
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None  # noqa: A002
                    ) -> tuple[Any, Any]:
        """Write ``input``, read stdout and stderr to their end, wait; as ``Popen`` does,
        a call after a ``TimeoutExpired`` goes on where the last one stopped."""
        if not self._readers:
            for name in ("stdout", "stderr"):
                stream = getattr(self, name)
                if stream is not None:
                    self._out[name] = []
                    reader = threading.Thread(target=_read_all, daemon=True,
                                              args=(_binary(stream), self._out[name]))
                    reader.start()
                    self._readers.append(reader)
            if self.stdin is not None:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0, *self._collected())
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._collected()

    def _collected(self) -> tuple[Any, Any]:
        return tuple(self._decoded(self._out[name]) if name in self._out else None
                     for name in ("stdout", "stderr"))  # type: ignore[return-value]

    def _decoded(self, chunks: list[bytes]) -> Any:
        data = b"".join(chunks)
        if not self._text:
            return data
        text = data.decode(locale.getpreferredencoding(False))
        return text.replace("\r\n", "\n").replace("\r", "\n")

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def _binary(stream: IO[Any]) -> IO[bytes]:
    return stream.buffer if isinstance(stream, io.TextIOWrapper) else stream  # type: ignore[return-value]


def _read_all(stream: IO[bytes], into: list[bytes]) -> None:
    while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
        into.append(chunk)


_server = ForkServer()
atexit.register(_server.close)
_inherited: dict[str, int | None] = {"fd": None}


def inherit_zygote(fd: int) -> None:
    """Called in a forked process (``zygote._become``): ``fd`` is its own socket to the
    zygote it came from, which this process's ``run`` and ``Popen`` then use."""
    _inherited["fd"] = fd


def Popen(args: Sequence[str], *, sigint_ignored: bool = False,  # noqa: N802 - subprocess's name
          server: ForkServer | None = None, **kwargs: Any) -> Any:
    """A ``ForkedProcess`` when the zygote (``server``, default this process's) can start
    ``args``, else ``subprocess.Popen``."""
    server = server or _server
    if server.accepts(args) and set(kwargs) <= _FORKED_OPTIONS:
        return ForkedProcess(args, server, sigint_ignored=sigint_ignored, **kwargs)
    cgroup = kwargs.pop("cgroup", None)
    if sigint_ignored or cgroup:
        kwargs["preexec_fn"] = functools.partial(_before_exec, sigint_ignored, cgroup)
    return subprocess.Popen(args, **kwargs)


_FORKED_OPTIONS = {"stdin", "stdout", "stderr", "env", "cwd", "text", "start_new_session",
                   "pass_fds", "cgroup"}


def run(args: Sequence[str], *, input: Any = None, capture_output: bool = False,  # noqa: A002
        timeout: float | None = None, check: bool = False, **kwargs: Any
        ) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` through ``Popen`` above."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    proc = Popen(args, **kwargs)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(args, proc.wait(), out, err)
    if check:
        done.check_returncode()
    return done


def stop() -> None:
    """End this process's zygote now (it also ends with this process)."""
    _server.close()


def _before_exec(sigint_ignored: bool, cgroup: str | os.PathLike[str] | None) -> None:
    """What ``ForkedProcess`` does for these options, in a started process."""
    if cgroup:
        join_cgroup(cgroup)
    if sigint_ignored:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


__all__ = ["FORK_ENV", "ForkServer", "ForkedProcess", "Popen", "inherit_zygote", "run", "stop"]
