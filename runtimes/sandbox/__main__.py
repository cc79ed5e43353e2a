"""Start a sandbox server: ``python3 -m sandbox --state-dir DIR --workspace DIR``.

It takes an exclusive lock on ``<state-dir>/server.lock`` (a second server on the same
state folder exits with status 3), starts the shell, listens on loopback and then writes
``<state-dir>/server.json`` (``{pid, port, token, boot_id, workspace}``, mode 0600)
atomically: whoever waits for that file can talk to the server at once. The shell's
environment is this process's own: its starter passes only an allow-list.

The server creates everything owner-only (umask 077; the state folder 0700, its files
0600); the shell gets back the umask the server was started with (or ``--shell-umask``),
so the agent's files keep their usual modes. The values of the variables named by
``--secret-env`` (names only in argv, never values) are masked in everything the server
writes: journal, outputs, outcomes, log.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import functools
import logging
import os
import secrets
import signal
import sys
import threading

from . import EXIT_LOCKED, files, logs, shared_layer
from .container import ContainerShell
from .mask import TextMasker
from .server import MAX_CONNECTIONS, READ_TIMEOUT_S, SandboxServer
from .service import Service
from .shell_policy import confine_shell
from .util import open_private, private_dir, read_json, wall_time, write_json_atomic

logger = logging.getLogger("sandbox")

SHELL_ENV = {"TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", "HISTFILE": "/dev/null"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of the server."""
    return PARSER.parse_args(argv)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandbox", description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", required=True, help="journal, server.json, lock, log")
    parser.add_argument("--workspace", required=True, help="the folder the shell starts in")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--idle-timeout-s", type=float, default=120.0)
    parser.add_argument("--max-output-chars", type=int, default=10_000)
    parser.add_argument("--epoch", type=int, default=0, help="epoch claimed at launch")
    parser.add_argument("--interrupt-grace-s", type=float, default=2.0)
    parser.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="NAME",
        help="an environment variable whose value is masked in everything written",
    )
    parser.add_argument(
        "--shell-umask",
        type=lambda text: int(text, 8),
        default=None,
        help="octal umask of the shell (default: the one this server was started with)",
    )
    parser.add_argument("--container", default=None,
                        help="run the shell in this Docker container (through docker exec)")
    parser.add_argument("--docker", default="docker", help="the docker CLI")
    parser.add_argument("--container-workdir", default="/workspace",
                        help="where the workspace is mounted in the container")
    parser.add_argument("--container-user", default=None, help="uid:gid of the shell")
    parser.add_argument("--container-io", default=None, metavar="HOST_DIR:MOUNT",
                        help="folder for the shell's input, bind-mounted read-only at MOUNT")
    parser.add_argument("--container-env", action="append", default=[], metavar="NAME",
                        help="a variable of this process's environment the shell gets")
    parser.add_argument("--confine", action="store_true",
                        help="confine the shell (Landlock, seccomp; confinement.py)")
    parser.add_argument("--no-network", action="store_true",
                        help="with --confine: the shell may open Unix sockets only")
    parser.add_argument("--temporary", action="append", default=[], metavar="PATH",
                        help="with --confine: a temporary folder the shell may write")
    parser.add_argument("--writable", action="append", default=[], metavar="PATH",
                        help="with --confine: a folder the shell may write beside the workspace")
    parser.add_argument("--unreadable", action="append", default=[], metavar="PATH",
                        help="with --confine: a path the shell may neither read nor write")
    parser.add_argument("--read-timeout-s", type=float, default=READ_TIMEOUT_S)
    parser.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS)
    parser.add_argument("--file-timeout-s", type=float, default=files.FILE_TIMEOUT_S)
    return parser


PARSER = _parser()
"""Built at import, so once in the zygote: a forked server only parses (building it was
a quarter of a forked server's start, most of it compiling argparse's regexes)."""


@functools.lru_cache(maxsize=None)  # Python 3.8 (a container's) has no functools.cache
def _libc() -> ctypes.CDLL | None:
    """Loaded once (by the zygote, which names itself first): servers share it."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def _name_process(name: bytes) -> None:
    """``ps`` shows the server by its role (Linux ``prctl(PR_SET_NAME)``; else nothing)."""
    try:
        _libc().prctl(15, name[:15], 0, 0, 0)  # type: ignore[union-attr]
    except AttributeError:  # no libc, or no prctl in it
        pass


def main(argv: list[str] | None = None) -> int:
    """Run the server until it is shut down or idle; returns the exit status."""
    args = parse_args(argv)
    _name_process(b"trouper-sandbox")
    masker = TextMasker({n: os.environ[n] for n in args.secret_env if n in os.environ})
    logs.configure(masker)
    state_dir = os.path.abspath(args.state_dir)
    workspace = os.path.abspath(args.workspace)
    os.makedirs(workspace, exist_ok=True)  # the agent's folder: the caller's umask
    started_umask = os.umask(0o077)  # everything else the server makes is owner-only
    private_dir(state_dir)
    lock_fd = _lock(os.path.join(state_dir, "server.lock"))
    if lock_fd is None:
        logger.error("another sandbox server holds %s", state_dir)
        return EXIT_LOCKED
    boot_id = secrets.token_hex(8)
    env = dict(os.environ)  # the caller passes an allow-list (runtimes/local.py PASSED_ENV)
    env.update(SHELL_ENV)
    container = _container(args)
    confined = None
    if args.confine and not container:
        confined = confine_shell(workspace, tuple(args.temporary), tuple(args.writable),
                                 tuple(args.unreadable), not args.no_network, env=env)
    else:
        shared_layer.discard()  # a layer of the zygote's: not this server's to hold
    service = Service(
        state_dir,
        workspace,
        env,
        boot_id,
        args.epoch,
        args.max_output_chars,
        args.interrupt_grace_s,
        masker=masker,
        shell_umask=started_umask if args.shell_umask is None else args.shell_umask,
        file_timeout_s=args.file_timeout_s,
        container=container,
        confinement=confined,
    )
    service.start()
    server = SandboxServer(
        (args.host, args.port),
        service,
        secrets.token_hex(32),
        args.idle_timeout_s,
        read_timeout_s=args.read_timeout_s,
        max_connections=args.max_connections,
    )
    service.on_gone = server.stop_soon
    info_path = os.path.join(state_dir, "server.json")
    info = {
        "pid": os.getpid(),
        "port": server.port,
        "host": args.host,
        "token": server.token,
        "boot_id": boot_id,
        "workspace": service.workspace,
        "started_at": wall_time(),
        "container": args.container,
        "confinement": confined.report() if confined is not None else None,
    }
    write_json_atomic(info_path, info, mode=0o600)
    try:
        _serve(server)
    finally:
        if confined is not None:
            confined.close()
    if (read_json(info_path) or {}).get("boot_id") == boot_id:
        os.unlink(info_path)
    logger.info("sandbox server %s stopped", boot_id)
    return 0


def _container(args: argparse.Namespace) -> ContainerShell | None:
    """Where the shell runs, when ``--container`` says it runs in a container."""
    if not args.container:
        return None
    io_dir, _, io_mount = (args.container_io or "").partition(":")
    if not io_dir or not io_mount:
        raise SystemExit("--container needs --container-io HOST_DIR:MOUNT")
    where = ContainerShell(args.docker, args.container, args.container_workdir, io_dir,
                           io_mount, args.container_user, args.container_env)
    where.clean_io()  # an earlier server's FIFOs and command files
    return where


def _serve(server: SandboxServer) -> None:
    def on_signal(signum: int, frame: object) -> None:
        logger.warning("signal %d: shutting down", signum)
        server.stop_soon()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    threading.Thread(target=server.watch_idle, name="idle-watchdog", daemon=True).start()
    logger.info("sandbox server pid %d listening on port %d", os.getpid(), server.port)
    try:
        server.serve_forever()
    finally:
        server.service.close()
        server.server_close()


def _lock(path: str) -> int | None:
    fd = open_private(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return fd


if __name__ == "__main__":
    sys.exit(main())
