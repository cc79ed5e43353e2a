"""How a local sandbox server process comes to be: forked by the program's sandbox zygote
(``sandbox_zygote.py``) when it runs one, else started afresh as ``python -I -S``.

Either way the server gets the same arguments, environment (an allow-list the caller
builds), folder (its state folder), session of its own and log (``server.log``, 0600);
only its parent differs, and so how its starter learns its exit status: from ``poll``, or
from the zygote, which reaps it and tells.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..host.processes import current_umask, pid_alive
from . import sandbox_zygote
from .sandbox.logs import LOG_FORMAT_ENV, LOG_SESSION_ENV
from .sandbox_zygote import EXIT_UNKNOWN, RUNTIMES_DIR

__all__ = ["BOOT", "EXITED", "RUNTIMES_DIR", "Launched", "launch_server", "open_log",
           "server_log_env"]

BOOT = (
    "import sys; sys.modules['ssl'] = sys.modules['_hashlib'] = None; "
    "sys.path.insert(0, sys.argv.pop(1)); "
    "from sandbox.__main__ import main; sys.exit(main())"
)
"""Run with ``python -I -S``: no site-packages, no PYTHON* variables, nothing from the cwd.
OpenSSL stays unloaded (http.client would import ssl, hmac and hashlib _hashlib; their
stdlib fallbacks do the server's hashing and constant-time compare): ~1.2 MB less
private memory per sandbox."""
EXITED = EXIT_UNKNOWN
"""The exit status of a forked server whose zygote (its parent) went before telling it."""


@dataclass
class Launched:
    """A server process just launched on ``state_dir``; ``close()`` once its start is
    settled."""

    pid: int
    state_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    """Set when started afresh: this process is its parent."""
    status: socket.socket | None = None
    """Set when forked: the zygote, its parent, sends its exit status here."""

    def exit_code(self) -> int | None:
        """None while it runs; its exit status once it exited (``EXITED`` for a forked
        one whose zygote went before telling: then its pid says whether it runs)."""
        if self.proc is not None:
            return self.proc.poll()
        code = EXITED if self.status is None else sandbox_zygote.read_exit(self.status)
        if code == EXITED and pid_alive(self.pid):
            return None
        return code

    def describe(self, code: int) -> str:
        return "exited" if code == EXITED else f"exited with status {code}"

    def close(self) -> None:
        """No more questions about its exit (the zygote then forgets it)."""
        if self.status is not None:
            self.status.close()
            self.status = None


def launch_server(args: list[str], env: dict[str, str], state_dir: Path) -> Launched:
    """Launch a server with the command-line ``args`` (after its boot) in ``state_dir``."""
    log_path = state_dir / "server.log"
    with open_log(log_path) as log:  # made owner-only here, whoever writes it
        forked = sandbox_zygote.spawn(args, env, state_dir, log_path, current_umask())
        if forked is not None:
            return Launched(forked[0], state_dir, status=forked[1])
        proc = subprocess.Popen(
            [sys.executable or "python3", "-I", "-S", "-c", BOOT, str(RUNTIMES_DIR), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=state_dir,
            start_new_session=True,
            close_fds=True,
        )
    return Launched(proc.pid, state_dir, proc)


def server_log_env(session_id: str) -> dict[str, str]:
    """What a server's environment says of its log: JSON lines naming ``session_id`` when
    trouper's are JSON (``TROUPER_LOG_FORMAT``, read from this process's settings, which
    may come from a config file), else nothing: text. The server takes both off its
    environment before its shell starts (``sandbox/logs.py``)."""
    from ..config.settings import settings

    if settings().log_format != "json":
        return {}
    return {LOG_FORMAT_ENV: "json", LOG_SESSION_ENV: session_id}


def open_log(path: Path) -> BinaryIO:
    """server.log for appending, owner-only (0600) whatever the umask, never via a symlink."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")
