"""Start ``python -m trouper ...`` processes in tests without paying their imports each time.

A fresh trouper process spends ~3.5 s of CPU importing trouper and litellm before it does
anything; a suite that starts dozens of them spends most of its CPU there. ``run`` and
``Popen`` here take the arguments of their ``subprocess`` namesakes and fork the process
from a zygote (``zygote.py`` here) that imported all that once: a real process with its
own pid, descriptors, environment, folder, session and exit status, running the real
entry point, in a few milliseconds.

    from accel import forkserver  # tests/accel: conftest.py puts tests/ on sys.path
    done = forkserver.run([sys.executable, "-m", "trouper", "demo"], capture_output=True)
    proc = forkserver.Popen([sys.executable, "-m", "trouper", "run", ...],
                            start_new_session=True, sigint_ignored=True)

What differs from a started process: ``/proc/PID/cmdline`` and ``/proc/PID/environ`` show
the zygote's, and the modules in ``PRELOAD`` are already imported. An import may
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
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from trouper.testing.cgroups import join_cgroup

from . import worker_python
from .forked_process import ForkedProcess

FORK_ENV = "TROUPER_TEST_FORK"
PRELOAD = ("trouper.cli", "trouper.client.actor_system", "trouper.daemon.server",
           "trouper.daemon.app", "trouper.testing.fake_llm")
"""What a trouper process imports at the most: ~3.5 s of CPU (litellm ~2.5) paid once;
with it, what opening an actor system loads for litellm's first call (~0.14 s each)."""
RUNTIME_ENV = ("TROUPER_", "COLUMNS", "LINES", "PYTEST_CURRENT_TEST", "THESPIAN_BASE_IPADDR",
               "THESPLOG_FILE", "TIKTOKEN_CACHE_DIR")
"""What a forked process's environment may change from the zygote's: variables read after
start-up (pytest sets ``PYTEST_CURRENT_TEST`` for each test; opening an actor system sets
the Thespian two, importing litellm the last). Any other (``PYTHONPATH``, the many that
litellm reads on import) must match."""
START_TIMEOUT_S = 120.0
ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")
"""Started by its path, not with ``-m``: ``tests/`` is on no path until conftest.py puts it
there, so the zygote puts it on its own and runs as ``accel.zygote``."""


class ForkServer:
    """One zygote and the socket to it; safe to use from several threads."""

    def __init__(self, preload: Sequence[str] | None = None) -> None:
        """``preload``: the modules the zygote imports (default ``PRELOAD``)."""
        self._preload = None if preload is None else list(preload) or ["sys"]
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self._zygote: subprocess.Popen[bytes] | None = None
        self._retired: list[subprocess.Popen[bytes]] = []
        self._env: dict[str, str] = {}
        self._listener: socket.socket | None = None
        """A listening socket the next zygote takes (``serve_workers``)."""

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

    def listen(self, path: str) -> None:
        """Start a zygote (as ``spawn`` would) that also takes requests from whoever
        connects to the Unix socket ``path``: its folder must be open to its owner only."""
        folder = os.path.dirname(path)
        if os.stat(folder).st_mode & 0o077:
            raise PermissionError(f"{folder} is open to others: the zygote forks on request")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
        listener.listen(64)
        with self._lock:
            self._retire()
            self._listener = listener
            self._started(dict(os.environ))

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
        listen: list[str] = []
        passed = [theirs.fileno()]
        if self._listener is not None:
            listen = ["--listen", str(self._listener.fileno())]
            passed.append(self._listener.fileno())
        zygote = subprocess.Popen(
            [sys.executable, ZYGOTE, str(theirs.fileno()), *listen,
             *(PRELOAD if self._preload is None else self._preload)],
            pass_fds=passed, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env=env, start_new_session=True, cwd="/")
        theirs.close()
        if self._listener is not None:
            self._listener.close()  # the zygote's now
            self._listener = None
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


def serve_workers(folder: str | os.PathLike[str]) -> str:
    """In pytest's controller: start this process's zygote, importing ``WORKER_PRELOAD``
    too, listening in ``folder`` (``ForkServer.listen``), and return the ``python``
    command that forks a worker from it (``worker_python.py``), for pytest-xdist's
    ``popen//python=``; the workers find the socket in this process's environment."""
    path = os.path.join(folder, "zygote.sock")
    os.environ[worker_python.SOCKET_ENV] = path  # first: the zygote's and the workers' agree
    _server._preload = [*PRELOAD, *WORKER_PRELOAD]
    _server.listen(path)
    return worker_command()


def worker_command() -> str:
    """``python`` for a process forked by the zygote named in ``worker_python.SOCKET_ENV``."""
    return f"{sys.executable} -I -S {worker_python.__file__}"


WORKER_PRELOAD = ("pytest", "xdist.remote")
"""What pytest's workers import besides trouper (assertion rewriting still applies to the
suite's modules: they are imported in the worker)."""


def stop() -> None:
    """End this process's zygote now (it also ends with this process)."""
    _server.close()


def _before_exec(sigint_ignored: bool, cgroup: str | os.PathLike[str] | None) -> None:
    """What ``ForkedProcess`` does for these options, in a started process."""
    if cgroup:
        join_cgroup(cgroup)
    if sigint_ignored:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


__all__ = ["FORK_ENV", "ForkServer", "ForkedProcess", "Popen", "inherit_zygote", "run",
           "serve_workers", "stop", "worker_command"]
