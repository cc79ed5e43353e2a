"""One interactive bash in a pty, and the prompt marker that tells where a command ends.

bash runs as ``bash --noprofile --norc --noediting -i`` on the slave side of a pty, so it
has job control: each command line runs in a foreground process group that Ctrl-C
(``\\x03`` written to the master) interrupts as a whole, and that ``kill_foreground`` can
SIGKILL without touching the shell itself. Its PS1 is ``<prefix><$?>:<line id>__``: a marker
that carries the exit status of the command line and the id of the line it answers, and
cannot be confused with output because the prefix holds a random nonce.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import select
import shutil
import signal
import struct
import termios
import time
from typing import Optional, Tuple

from .confinement import Prepared

MARKER_SUFFIX = "__"
_WINSIZE = (50, 200)
"""Rows and columns the pty reports: wide enough that tools rarely wrap."""


LINE_ID_VAR = "__trouper_line"
"""The shell variable each input line sets to its id; PS1 prints it back."""
INIT_LINE = f"{LINE_ID_VAR}=1; export -n PS1 PS2; set +H; set +o history; unset PROMPT_COMMAND\n"
"""The first line bash is sent: line id 1, PS1 not exported, no history expansion."""


def prompt_string(prefix: str) -> str:
    """The PS1 that prints the marker: ``<prefix><exit status>:<line id>__``."""
    return f"{prefix}$?:${{{LINE_ID_VAR}}}{MARKER_SUFFIX}"


def encode_command(line_id: int, command: str) -> bytes:
    """``command`` as one input line that runs it whole: ``eval $'<escaped>' </dev/null``.

    Every byte outside printable ASCII, and ``\\``, ``'`` and ``!``, is written as
    ``\\xHH``, so the line holds no control character the tty would act on, and
    multi-line commands produce exactly one prompt. Standard input is /dev/null: a
    command waiting for input would otherwise hang until its timeout.
    """
    parts = []
    for byte in command.replace("\x00", "").encode("utf-8", "replace"):
        char = chr(byte)
        if 32 <= byte < 127 and char not in "\\'!":
            parts.append(char)
        else:
            parts.append(f"\\x{byte:02x}")
    escaped = "".join(parts)
    return f"{LINE_ID_VAR}={line_id}; eval $'{escaped}' </dev/null\n".encode("ascii")


Prompt = Tuple[int, Optional[int]]
"""``(exit status, line id)`` of one prompt; the id is None before the first line."""


_PARTIAL_MARKER = re.compile(r"\d{0,10}(?::\d{0,20}_?)?")
"""What may follow a marker's prefix before the marker is whole (compiled in the zygote)."""


class PromptParser:
    """Splits the text read from the pty into output and prompts."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        marker = re.escape(prefix) + r"(\d+):(\d*)" + re.escape(MARKER_SUFFIX)
        self._marker = re.compile(marker)
        self._partial = _PARTIAL_MARKER
        self._held = ""

    def feed(self, text: str) -> list[tuple[str, Prompt | None]]:
        """Events in order: ``(output, None)`` for output, ``(output, prompt)`` for a prompt.

        Text that might be the start of a marker is held back until the next feed.
        """
        buf = self._held + text
        events: list[tuple[str, Prompt | None]] = []
        while True:
            match = self._marker.search(buf)
            if match is None:
                break
            line_id = int(match.group(2)) if match.group(2) else None
            events.append((buf[: match.start()], (int(match.group(1)), line_id)))
            buf = buf[match.end() :]
        out, self._held = self._split_held(buf)
        if out:
            events.append((out, None))
        return events

    def flush(self) -> str:
        """Text held back as a possible marker start (when no more is coming)."""
        held, self._held = self._held, ""
        return held

    def _split_held(self, buf: str) -> tuple[str, str]:
        size = len(self._prefix)
        for i in range(max(0, len(buf) - size - 34), len(buf)):
            tail = buf[i:]
            if self._prefix.startswith(tail):
                return buf[:i], tail
            if tail.startswith(self._prefix) and self._partial.fullmatch(tail[size:]):
                return buf[:i], tail
        return buf, ""


class BashProcess:
    """An interactive bash on a pty: write lines, read output, interrupt, kill."""

    def __init__(self, workspace: str, env: dict[str, str], umask: int | None = None,
                 confined: Prepared | None = None) -> None:
        """Start bash in ``workspace`` with ``env``; ``umask`` (default: this process's)
        is the one its commands create files with; ``confined`` (None: not) confines it
        (applied in the child; the caller keeps it for the next shell)."""
        bash = shutil.which("bash", path=env.get("PATH")) or "/bin/bash"
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: never returns
            _exec_bash(bash, workspace, env, umask, confined)
        self.apply_modes()
        self.exit_status: int | None = None
        """Set once bash has exited and was reaped (negative: killed by that signal)."""
        self.last_prompt_id: int | None = None
        """The line id of the last prompt seen (kept by the reader of the pty)."""

    def apply_modes(self) -> None:
        """(Re)set the tty modes the protocol needs: no echo, raw lines, no CR added."""
        try:
            termios.tcsetattr(self.fd, termios.TCSANOW, _modes(termios.tcgetattr(self.fd)))
        except (OSError, termios.error):
            pass

    def send_init(self) -> None:
        """Send the first line (line id 1), which readies the shell for the protocol."""
        self.write(INIT_LINE.encode("ascii"))

    def send(self, line_id: int, command: str) -> None:
        """Send ``command`` as the input line ``line_id`` (see ``encode_command``)."""
        self.write(encode_command(line_id, command))

    def write(self, data: bytes) -> None:
        """Write all of ``data`` to the shell's input."""
        while data:
            written = os.write(self.fd, data)
            data = data[written:]

    def read(self, timeout_s: float | None) -> bytes | None:
        """Output read within ``timeout_s`` (``b""`` if none, or when bash has exited);
        None once the pty is closed. ``timeout_s`` None waits for one or the other."""
        exit_fd = self.exit_watch()
        try:
            ready, _, _ = select.select([self.fd] if exit_fd is None else [self.fd, exit_fd],
                                        [], [], timeout_s)
            if self.fd not in ready:
                return b""
            data = os.read(self.fd, 65536)
        except OSError as e:
            if e.errno in (errno.EIO, errno.EBADF):
                return None
            raise
        return data or None

    def interrupt(self) -> None:
        """Send Ctrl-C: SIGINT to the foreground process group."""
        self.write(b"\x03")

    def kill_foreground(self) -> bool:
        """SIGKILL the foreground process group, unless it is the shell's own."""
        try:
            pgrp = os.tcgetpgrp(self.fd)
        except OSError:
            return False
        if pgrp <= 0 or pgrp == self.pid:
            return False
        try:
            os.killpg(pgrp, signal.SIGKILL)
        except OSError:
            return False
        return True

    def kill_all(self) -> None:
        """SIGKILL the shell and every process of its session (its jobs included).

        Everything is stopped (SIGSTOP) before anything is killed, the shell first: a job
        killed while its shell still ran let the shell start the next command of the line
        (``sleep 30; echo one >> ledger``) before its own SIGKILL landed."""
        alive = self.exit_status is None  # not reaped: the pid is still this bash
        if alive:
            _signal(self.pid, signal.SIGSTOP)
        members = _session_members(self.pid)
        for pid in members:
            _signal(pid, signal.SIGSTOP)
        if alive:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            _signal(self.pid, signal.SIGKILL)
        for pid in members + _session_members(self.pid):  # and any forked meanwhile
            _signal(pid, signal.SIGKILL)

    def reap(self) -> int | None:
        """The shell's exit status once it has exited (without blocking), else None."""
        if self.exit_status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.exit_status = -1
                return self.exit_status
            if pid == 0:
                return None
            self.exit_status = _exit_code(status)
        return self.exit_status

    def reap_within(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for bash to exit, then kill it; its exit status."""
        deadline = time.monotonic() + timeout_s
        while self.reap() is None:
            if time.monotonic() >= deadline:
                self.kill_all()
                deadline = time.monotonic() + 1.0
            time.sleep(0.01)
        return self.exit_status if self.exit_status is not None else -1

    _exit_fd: int | None = None
    _exit_watched = False

    def exit_watch(self) -> int | None:
        """A descriptor readable once bash has exited (a Linux pidfd, opened on first
        use), so a reader can wait without polling; None where there is none."""
        if not self._exit_watched:
            self._exit_watched = True
            try:
                self._exit_fd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):
                self._exit_fd = None
        return self._exit_fd

    def close(self) -> None:
        """Close the master side of the pty and the exit watch (idempotent)."""
        exit_fd, self._exit_fd = self._exit_fd, None
        if exit_fd is not None:
            os.close(exit_fd)
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError:
                pass


def _exec_bash(bash: str, workspace: str, env: dict[str, str], umask: int | None,
               prepared: Prepared | None) -> None:
    try:
        _default_signals()
        if umask is not None:
            os.umask(umask)  # the server's own is 077; the agent's files get the usual modes
        os.chdir(workspace)
        termios.tcsetattr(0, termios.TCSANOW, _modes(termios.tcgetattr(0)))
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", _WINSIZE[0], _WINSIZE[1], 0, 0))
        if prepared is not None:  # before the descriptors close: it holds the rule set's
            prepared.apply()
        _close_inherited_fds()
        os.execve(bash, ["bash", "--noprofile", "--norc", "--noediting", "-i"], env)
    except BaseException as e:  # noqa: BLE001 - whatever happens, the child must not return
        os.write(2, (f"cannot start bash: {e}\n").encode("utf-8", "replace"))
    os._exit(127)


def _default_signals() -> None:
    """Default dispositions and no blocked signals: what the server inherited (SIGINT
    ignored by a launching shell, SIGPIPE ignored by Python) must not reach commands, or
    Ctrl-C and broken pipes would stop nothing."""
    for signum in range(1, signal.NSIG):
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(signum, signal.SIG_DFL)
            except (OSError, ValueError, RuntimeError):
                pass
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _close_inherited_fds() -> None:
    """Close every descriptor but the pty's 0-2: the server's listening socket, journal
    files and other shells' ptys must never reach the agent's commands (trouper opens
    them close-on-exec as well; this also covers whatever was not)."""
    try:
        highest = max(int(name) for name in os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        highest = 4096
    os.closerange(3, highest + 1)


def _modes(attrs: list) -> list:
    """No echo, no canonical line editing (lines may exceed 4 KiB), no CR before LF."""
    attrs = list(attrs)
    attrs[1] &= ~termios.ONLCR
    attrs[3] &= ~(termios.ECHO | termios.ICANON)
    attrs[3] |= termios.ISIG
    chars = list(attrs[6])
    chars[termios.VMIN] = 1
    chars[termios.VTIME] = 0
    attrs[6] = chars
    return attrs


def _session_members(sid: int) -> list[int]:
    members = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return members
    for name in names:
        if name.isdigit() and int(name) != sid:
            try:
                if os.getsid(int(name)) == sid:
                    members.append(int(name))
            except OSError:
                continue
    return members


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
