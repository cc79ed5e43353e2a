"""The program's side of the sandbox-server zygote (``sandbox/zygote.py`` is the other).

``prepare()`` runs in the program before its actor system forks anything: it makes the
channel (a ``SOCK_SEQPACKET`` socketpair) and a one-byte shared page saying whether the
zygote runs; every actor forked afterwards inherits both (``actors/forking.py`` keeps the
channel). The zygote itself is started only when the program is about to have sandboxes
(``ensure_started``: a session started or restored), so a program that never starts one
pays nothing. ``spawn()`` then asks it for a server from any of those processes; it
answers None (and the caller starts the server afresh, as before) when there is no
zygote in this process's family, it is not running yet, or it does not answer.

The zygote is an exec'd ``python -I -S`` that imports the server's own modules and nothing
of trouper, like a server started afresh. It exits once every holder of the channel has
closed it; ``release()`` closes the program's end and waits for it.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RUNTIMES_DIR = Path(__file__).resolve().parent
"""The folder holding the ``sandbox`` package; its processes import it from here."""
_BOOT = (
    "import sys; sys.modules['ssl'] = sys.modules['_hashlib'] = None; "
    "sys.path.insert(0, sys.argv.pop(1)); "
    "from sandbox.zygote import serve; sys.exit(serve(int(sys.argv[1])))"
)
"""As the server's own boot (runtimes/local.py): no site-packages, no OpenSSL."""
ANSWER_TIMEOUT_S = 10.0
"""How long a requester waits for the pid (a loaded machine forks slowly)."""
EXIT_UNKNOWN = -1000
"""A forked server's exit status when its zygote is gone before telling it."""
ENABLED_ENV = "TROUPER_SANDBOX_ZYGOTE"
"""Set to ``0`` to start every sandbox server afresh."""

_lock = threading.Lock()
_state: dict[str, Any] = {"channel": None, "zygote_end": None, "flag": None, "proc": None,
                          "users": 0, "pid": 0, "log": None}


def prepare(log: Path | None = None) -> None:
    """In the program, before its actor system forks: make the channel (once per
    program; every ``Trouper`` of it shares one zygote). ``log``: where the zygote's own
    last words go (an owner-only file; else nowhere, never the program's stderr)."""
    if os.environ.get(ENABLED_ENV, "1") == "0":
        return
    with _lock:
        if _state["channel"] is not None and _state["pid"] == os.getpid():
            _state["users"] += 1
            return
        channel, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        flag = mmap.mmap(-1, 1)  # shared with every process forked from here
        _state.update(channel=channel, zygote_end=zygote_end, flag=flag, proc=None,
                      users=1, pid=os.getpid(), log=log)


def ensure_started() -> None:
    """Start the zygote if this program prepared one and it does not run yet."""
    with _lock:
        zygote_end, flag = _state["zygote_end"], _state["flag"]
        if zygote_end is None or flag is None or flag[0] or _state["pid"] != os.getpid():
            return
        fd = zygote_end.fileno()
        env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
        env[ENABLED_ENV] = "1"  # the zygote's own: a server gets the request's alone
        try:
            with _log_file(_state["log"]) as err:
                proc = subprocess.Popen(
                    [sys.executable or "python3", "-I", "-S", "-c", _BOOT,
                     str(RUNTIMES_DIR), str(fd)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    pass_fds=(fd,), env=env, start_new_session=True, close_fds=True)
        except OSError as e:
            logger.warning("no sandbox zygote (servers start afresh): %s", e)
            return
        zygote_end.close()  # the zygote's now; it sees EOF when the last holder closes ours
        _state.update(zygote_end=None, proc=proc)
        flag[0] = 1
        logger.info("sandbox zygote pid %d started", proc.pid)


def _log_file(path: Path | None) -> Any:
    """The zygote's stderr: ``path`` for appending, owner-only, or /dev/null."""
    if path is None:
        return open(os.devnull, "wb")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    return os.fdopen(fd, "ab")


def channel_fd() -> int | None:
    """The channel's descriptor (a forked actor keeps it), or None."""
    channel = _state["channel"]
    return channel.fileno() if channel is not None else None


def spawn(argv: list[str], env: dict[str, str], cwd: Path, log: Path, umask: int
          ) -> tuple[int, socket.socket] | None:
    """A server forked by the zygote with these arguments (the server's own, after its
    boot), environment, folder, log file and umask: its pid and the socket on which the
    zygote will send its exit status (``read_exit``; close it when no longer asking);
    None when no zygote can."""
    channel, flag = _state["channel"], _state["flag"]
    if channel is None or flag is None or not flag[0]:
        return None
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            # never blocks: a zygote that stopped reading means starting afresh
            socket.send_fds(channel, [b"s"], [theirs.fileno()], socket.MSG_DONTWAIT)
        finally:
            theirs.close()
        mine.settimeout(ANSWER_TIMEOUT_S)
        request = {"argv": argv, "env": env, "cwd": str(cwd), "log": str(log),
                   "umask": umask}
        mine.sendall(json.dumps(request).encode() + b"\n")
        answer = _read_answer(mine)
    except (OSError, ValueError) as e:
        mine.close()
        logger.warning("the sandbox zygote did not answer (starting the server afresh): %s",
                       e)
        return None
    if "pid" not in answer:
        mine.close()
        logger.warning("the sandbox zygote refused (starting the server afresh): %s",
                       answer.get("error"))
        return None
    mine.setblocking(False)
    return int(answer["pid"]), mine


def read_exit(status: socket.socket) -> int | None:
    """From a ``spawn`` socket, without waiting: the server's exit status once the zygote
    sent it; None while it runs; ``EXIT_UNKNOWN`` when the zygote is gone and cannot tell."""
    try:
        data = status.recv(4096, socket.MSG_PEEK)
    except BlockingIOError:
        return None
    except OSError:
        return EXIT_UNKNOWN
    if not data:
        return EXIT_UNKNOWN
    if not data.endswith(b"\n"):
        return None  # the rest is on its way
    try:
        return int(json.loads(data)["exit"])
    except (ValueError, KeyError, TypeError):
        return EXIT_UNKNOWN


def _read_answer(conn: socket.socket) -> dict[str, Any]:
    """The zygote's first line on ``conn``, read to its end and no further: a server that
    exited at once has its exit status right behind it, for ``read_exit``."""
    data = b""
    while not data.endswith(b"\n"):
        peek = conn.recv(4096, socket.MSG_PEEK)
        if not peek:
            raise ValueError("the zygote closed without an answer")
        end = peek.find(b"\n")
        data += conn.recv(end + 1 if end >= 0 else len(peek))
    answer = json.loads(data)
    if not isinstance(answer, dict):
        raise ValueError(f"the zygote answered {answer!r}")
    return answer


def release(wait_s: float = 5.0) -> None:
    """One ``Trouper`` of the program closed; the last closes the program's end and
    waits (up to ``wait_s``) for the zygote, which exits when no actor holds it either."""
    with _lock:
        if _state["channel"] is None or _state["pid"] != os.getpid():
            return
        _state["users"] -= 1
        if _state["users"] > 0:
            return
        channel, zygote_end, proc = _state["channel"], _state["zygote_end"], _state["proc"]
        _state.update(channel=None, zygote_end=None, flag=None, proc=None, users=0, pid=0)
    channel.close()
    if zygote_end is not None:
        zygote_end.close()
    if proc is not None:
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            # actors of a detached system still hold it: it stays theirs
            logger.info("sandbox zygote pid %d outlives this program's close", proc.pid)
