"""A process forked by the test zygote (``zygote.py`` here) through ``forkserver``:
as much of ``subprocess.Popen`` as tests use."""

from __future__ import annotations

import io
import json
import locale
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol


class Spawner(Protocol):
    """What forks: ``forkserver.ForkServer``."""

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None,
              targets: dict[int, int], new_session: bool, sigint_ignored: bool,
              cgroup: str | None = None) -> int: ...


class ForkedProcess:
    """A process forked by the zygote, as much of ``subprocess.Popen`` as tests use."""

    def __init__(self, args: Sequence[str], server: Spawner, *,
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
            reply_fd = server.spawn(args, env=env, cwd=os.fspath(cwd) if cwd is not None else None,
                                    targets=child,
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


__all__ = ["ForkedProcess", "Spawner"]
