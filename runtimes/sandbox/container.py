"""The session's shell inside a Docker container: ``sh -i`` reached through ``docker exec``.

The marker protocol of ``bash.py``, in POSIX ``sh`` (busybox ash, dash, bash as sh):
nothing but ``sh`` is needed in the image.

- ``docker exec -i -t [-u U] [-w W] -e NAME... <container> sh -c '...; exec sh -i <FIFO'``
  runs on the slave side of a host pty. The docker CLI puts that pty in raw mode and
  forwards every byte to the exec's own tty in the container, so Ctrl-C written here
  becomes SIGINT for the foreground job *in the container* (job control works there: the
  shell is interactive on that tty). Values never appear in argv: ``-e NAME`` takes each
  value from the CLI's environment.
- The shell reads its input from a FIFO in a host folder bind-mounted read-only into the
  container (``io_dir`` at ``io_mount``), not from the tty: so there is no echo and no
  line editing, whatever the shell. The FIFO is owner-only (0600) and belongs to the
  container's uid (given to it when this server is root). Each command travels through
  the FIFO itself, never through a file (a revealed secret would rest on disk), as
  ``__trouper_line=N; \\eval "$(\\command printf '<text>')" </dev/null`` with every byte
  outside a safe printable set written as a ``\\ooo`` octal escape (``encode_line``):
  any text of any length, decoded by builtins only (no ``$'..'``, which is not POSIX); a
  syntax error stays inside the ``eval`` and the prompt still comes. The backslashes keep
  an alias, and ``command`` a function, of the agent's from taking the protocol's names.
- The shell's ``HOME`` is the image's for its uid when that folder is writable, else
  ``/tmp`` (an unprivileged uid the image does not know gets ``/``).
- PS1 carries the marker (ash and dash expand ``$?`` and variables in PS1); the shell's
  tty turns ``\\n`` into ``\\r\\n``, turned back here.
- The host pty's foreground group is the docker CLI, not the job: killing the job, or the
  shell and its jobs on a restart, is done in the container, by a second ``docker exec``
  that reads ``/proc`` with sh builtins only (the shell reports its pid when it starts).
"""

from __future__ import annotations

import errno
import logging
import os
import pty
import re
import secrets
import select
import subprocess
import termios

from .bash import LINE_ID_VAR, BashProcess, _close_inherited_fds, _default_signals
from .owners import numeric_ids

logger = logging.getLogger(__name__)

PASSED_NAMES = ("TERM", "PAGER", "GIT_PAGER", "HISTFILE", "PS1", "PS2")
"""Variables of the server's shell environment that go into the container (by name)."""
HELPER_TIMEOUT_S = 10.0
"""Limit for one helper ``docker exec`` (kill a job, kill the shell, inspect)."""
INPUT_STALL_S = 30.0
"""Longest wait for the shell to take more of a command from its FIFO (a dead shell
never reads: the write gives up, and the command ends with the shell)."""
_SAFE_BYTES = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 !\"#$&()*+,-./:;<=>?@[]^_`{|}~"
)
"""Bytes a command's text keeps as they are inside ``printf '...'``: printable ASCII but
``'`` (ends the quotes), ``\\`` and ``%`` (printf's own escapes)."""
_ESCAPED = tuple(chr(b) if b in _SAFE_BYTES else f"\\{b:03o}" for b in range(256))
_HOME_FIX = '[ -d "$HOME" ] && [ -w "$HOME" ] || HOME=/tmp; export HOME; '
"""The shell's HOME must be a folder its uid can write (else ``/tmp``)."""

_KILL_SCRIPT = r"""
s=$1
read -r l < "/proc/$s/stat" || exit 1
r=${l##*)}
set -- $r
if [ "$MODE" = fg ]; then
  [ "$6" -gt 0 ] && [ "$6" != "$s" ] && kill -KILL -"$6" && exit 0
  exit 1
fi
for p in /proc/[0-9]*; do
  read -r l < "$p/stat" 2>/dev/null || continue
  r=${l##*)}
  set -- $r
  [ "$4" = "$s" ] && [ "${p#/proc/}" != "$s" ] && kill -KILL "${p#/proc/}" 2>/dev/null
done
kill -KILL "$s"
"""
"""``MODE=fg``: SIGKILL the shell's foreground job (exit 1 if there is none); else
SIGKILL every process of the shell's session, then the shell. Builtins only: fields 4
and 6 after the command name in ``/proc/PID/stat`` are the session and the tty's
foreground group."""


class ContainerShell:
    """How to reach one container: the docker CLI, the container, user and folders."""

    def __init__(
        self,
        docker: str,
        container: str,
        workdir: str,
        io_dir: str,
        io_mount: str,
        user: str | None = None,
        names: list[str] | None = None,
    ) -> None:
        self.docker = docker
        self.container = container
        self.workdir = workdir
        """The workspace's path inside the container."""
        self.io_dir = io_dir
        """Host folder (bind-mounted read-only at ``io_mount``) for the shell's FIFO."""
        self.io_mount = io_mount
        self.user = user
        """``uid:gid`` of the shell (None: the image's user)."""
        self.names = list(names or [])
        """Names of the variables (the session's env) passed into the container."""

    def spawn(self, workspace: str, env: dict[str, str], umask: int | None) -> BashProcess:
        """A ``ContainerProcess``: the ``Shell``'s ``spawn`` in a container."""
        return ContainerProcess(self, env, umask)

    def exec_argv(self, *command: str, tty: bool = False, names: list[str] = (),
                  stdin: bool = False) -> list[str]:
        """``docker exec`` of ``command`` in the container, as the shell's user (``stdin``:
        its standard input kept open, without a tty)."""
        argv = [self.docker, "exec"]
        argv += ["-i", "-t"] if tty else ["-i"] if stdin else []
        argv += ["-u", self.user] if self.user else []
        argv += ["-w", self.workdir]
        for name in names:
            argv += ["-e", name]
        return [*argv, self.container, *command]

    def kill(self, shell_pid: int, mode: str) -> bool:
        """Run the kill script for ``shell_pid`` (``fg``: its job; ``all``: it and its
        session). True when it killed something."""
        script = f"MODE={mode}\n{_KILL_SCRIPT}"
        argv = self.exec_argv("sh", "-c", script, "sh", str(shell_pid))
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=HELPER_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            logger.warning("cannot kill in container %s: %s", self.container[:12], e)
            return False
        return done.returncode == 0

    def state(self) -> str:
        """``running``, ``exited`` (and the like) or ``gone`` (removed, or docker cannot
        tell): from ``docker inspect``."""
        argv = [self.docker, "inspect", "--format", "{{.State.Status}}", self.container]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=HELPER_TIMEOUT_S, text=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            logger.warning("cannot inspect container %s: %s", self.container[:12], e)
            return "gone"
        return (done.stdout.strip() or "gone") if done.returncode == 0 else "gone"

    def make_fifo(self, path: str) -> int:
        """Make the shell's FIFO at ``path``; a descriptor open on it (``O_RDWR``: never
        blocks, and the shell never sees end-of-file while it is open; non-blocking
        writes). Owner-only, and its owner is the shell's uid: given to it when this
        process is root; a user other than this process's (not root) gets it 0604."""
        os.mkfifo(path, 0o600)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        owner = _ids(self.user)
        if os.geteuid() == 0 and owner is not None:
            os.fchown(fd, *owner)
        elif owner is None or owner[0] != os.geteuid():
            os.fchmod(fd, 0o604)  # the container's user must open it; the home keeps others out
        return fd

    def clean_io(self) -> None:
        """Remove every FIFO (and command file of an older trouper) left in ``io_dir``."""
        try:
            names = os.listdir(self.io_dir)
        except OSError:
            return
        for name in names:
            try:
                os.unlink(os.path.join(self.io_dir, name))
            except OSError:
                pass


class ContainerProcess(BashProcess):
    """``sh -i`` in the container, driven like ``BashProcess`` (see the module doc)."""

    def __init__(self, where: ContainerShell, env: dict[str, str], umask: int | None) -> None:
        self.where = where
        self.umask = umask
        self.ps1 = env.get("PS1", "")
        """The prompt (the protocol's marker), set by the first line."""
        self.nonce = secrets.token_hex(6)
        self.fifo = os.path.join(where.io_dir, f"in-{self.nonce}")
        self.input_fd = where.make_fifo(self.fifo)
        self.shell_pid: int | None = None
        """The pid of ``sh -i`` inside the container (its own pid namespace)."""
        self._early = b""
        self._cr = False
        fifo_inside = f"{where.io_mount}/in-{self.nonce}"
        script = f'{_HOME_FIX}echo "__TRPPID$$__"; exec sh -i <{fifo_inside}'
        names = [n for n in PASSED_NAMES if n in env] + [n for n in where.names if n in env]
        argv = where.exec_argv("sh", "-c", script, tty=True, names=names)
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: never returns
            _exec_cli(argv, env)
        self.apply_modes()
        self.exit_status = None
        self.last_prompt_id = None

    def apply_modes(self) -> None:
        """Raw: the docker CLI forwards every byte (Ctrl-C too) to the container's tty."""
        try:
            termios.tcsetattr(self.fd, termios.TCSANOW, _raw(termios.tcgetattr(self.fd)))
        except (OSError, termios.error):
            pass

    def send_init(self) -> None:
        """Line 1: PS1 set again, not exported (bash as sh drops an inherited PS1 in the
        non-interactive ``sh -c`` that starts it), PS2 empty, the umask, no ENV, and no
        line editing in bash (its readline would echo every line it reads, even from a
        FIFO: the commands' octal text, secrets and all, would be in the output)."""
        umask = f" umask {self.umask:03o};" if self.umask is not None else ""
        ps1 = self.ps1.replace("'", "'\\''")
        self._write_input(f"{LINE_ID_VAR}=1; unset PS1 ENV; PS1='{ps1}'; PS2=;{umask} "
                          '[ -z "${BASH_VERSION-}" ] || set +o emacs +o vi\n')

    def send(self, line_id: int, command: str) -> None:
        """Send ``command`` through the FIFO as one line (``encode_line``)."""
        self._write_input(encode_line(line_id, command))

    def _write_input(self, line: str | bytes) -> None:
        """Write all of ``line`` to the FIFO; OSError when the shell has taken none of it
        for ``INPUT_STALL_S`` (a pipe holds 64 KiB: a longer command waits on the shell)."""
        data = line.encode("utf-8") if isinstance(line, str) else line
        while data:
            try:
                data = data[os.write(self.input_fd, data):]
            except BlockingIOError:
                _, ready, _ = select.select([], [self.input_fd], [], INPUT_STALL_S)
                if not ready:
                    raise OSError(errno.ETIMEDOUT, "the shell stopped reading its input "
                                  f"for {INPUT_STALL_S:g} s") from None

    def read(self, timeout_s: float | None) -> bytes | None:
        """Output, with ``\\r\\n`` back to ``\\n`` and the shell's pid report taken out."""
        data = super().read(timeout_s)
        if data is None:
            return None
        if self.shell_pid is None and data:
            self._early += data
            match = re.search(rb"__TRPPID(\d+)__\r?\n", self._early)
            if match is None and len(self._early) < 65536:
                return b""
            if match is not None:
                self.shell_pid = int(match.group(1))
                data = self._early[: match.start()] + self._early[match.end():]
            else:
                data = self._early
            self._early = b""
        if self._cr:
            data = b"\r" + data
        self._cr = data.endswith(b"\r")
        if self._cr:
            data = data[:-1]
        return data.replace(b"\r\n", b"\n")

    def kill_foreground(self) -> bool:
        """SIGKILL the job running in the foreground of the container's shell."""
        return self.shell_pid is not None and self.where.kill(self.shell_pid, "fg")

    def kill_all(self) -> None:
        """SIGKILL the shell and its jobs in the container, then the docker CLI here."""
        if self.shell_pid is not None and self.exit_status is None:
            self.where.kill(self.shell_pid, "all")
        super().kill_all()

    def close(self) -> None:
        """Close the pty and the FIFO; remove the FIFO."""
        super().close()
        if self.input_fd >= 0:
            fd, self.input_fd = self.input_fd, -1
            os.close(fd)
        try:
            os.unlink(self.fifo)
        except OSError:
            pass


def encode_line(line_id: int, command: str) -> bytes:
    """``command`` as the input line ``line_id`` a POSIX sh decodes with builtins alone:
    ``__trouper_line=N; \\eval "$(\\command printf '<text>')" </dev/null``, every byte of
    the text (UTF-8; NUL dropped, as a shell cannot hold it) outside ``_SAFE_BYTES`` as a
    three-digit octal escape. Standard input is /dev/null: a command waiting for input
    would otherwise hang until its timeout."""
    data = command.replace("\x00", "").encode("utf-8", "surrogateescape")
    text = "".join(map(_ESCAPED.__getitem__, data))
    line = f"{LINE_ID_VAR}={line_id}; \\eval \"$(\\command printf '{text}')\" </dev/null\n"
    return line.encode("ascii")


def _ids(user: str | None) -> tuple[int, int] | None:
    """``(uid, gid)`` of a numeric, not root ``uid[:gid]``; None else (the image's user)."""
    try:
        return numeric_ids(user or "")
    except ValueError:
        return None


def _raw(attrs: list) -> list:
    attrs = list(attrs)
    attrs[0] &= ~(termios.BRKINT | termios.ICRNL | termios.INPCK | termios.ISTRIP | termios.IXON)
    attrs[1] &= ~termios.OPOST
    attrs[2] = (attrs[2] & ~(termios.CSIZE | termios.PARENB)) | termios.CS8
    attrs[3] &= ~(termios.ECHO | termios.ICANON | termios.IEXTEN | termios.ISIG)
    chars = list(attrs[6])
    chars[termios.VMIN] = 1
    chars[termios.VTIME] = 0
    attrs[6] = chars
    return attrs


def _exec_cli(argv: list[str], env: dict[str, str]) -> None:
    try:
        _default_signals()
        _close_inherited_fds()
        termios.tcsetattr(0, termios.TCSANOW, _raw(termios.tcgetattr(0)))
        os.execve(argv[0], argv, env)
    except BaseException as e:  # noqa: BLE001 - whatever happens, the child must not return
        os.write(2, (f"cannot start {argv[0]}: {e}\n").encode("utf-8", "replace"))
    os._exit(127)
