"""What the daemon process runs (``trouper daemon run``): take the home's lock, bind the
port, open the ``Trouper`` (which restores every unfinished session), serve HTTP until
SIGTERM or SIGINT, then close gracefully.

Order matters. The lock first: two daemons must never open actor systems on one home.
The socket next, so a port in use fails before any actor is forked. The ``Trouper``
then: it restores every session its log shows still working (RUNNING, LOADING,
RATE_LIMITED, an ERROR being recovered), taking each back at once (a new owner token in
the store, so the daemon never waits for a lease to expire, and a Controller of the dead
daemon, if one lived on, could not write). Closing stops the actors but not the
sandboxes, and changes no session's state: the next start carries each on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from types import FrameType
from typing import Any

import uvicorn

from ..config.files import use_config_files
from ..exceptions import ConfigError, TrouperError
from ..home.paths import Home, enter_private_process
from ..host.processes import die_if_forked, signal_handlers
from ..security.masking import install_log_masking
from ..serving.limits import HttpLimits, Notes
from ..serving.protocol import Door, guarded_protocol
from . import cluster_setup
from .auth import LOOPBACK_NAMES, allowed_hosts, limit_error_body
from .cluster_setup import ClusterOptions
from .files import DaemonFiles, HomeLock, clear_running, ensure_token, write_running

logger = logging.getLogger("trouper.daemon")

ALLOWED_HOSTS_ENV = "TROUPER_DAEMON_ALLOWED_HOSTS"
Ready = Callable[[dict[str, Any]], None]
"""Told once: the daemon's info when it serves, or ``{"error": message}``."""


class DaemonError(TrouperError):
    """The daemon cannot start, stop or be reached; the message says why."""


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling: ours asks it to exit, and it never
    re-raises the signal afterwards (the Trouper must still close)."""

    on_exit: Callable[[], None] = staticmethod(lambda: None)  # type: ignore[assignment]

    @contextmanager
    def capture_signals(self) -> Any:
        yield

    def request_exit(self) -> None:
        self.should_exit = True
        self.on_exit()


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: any free port). Raises DaemonError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        what = "in use" if exc.errno == 98 else (exc.strerror or str(exc))
        raise DaemonError(f"cannot listen on {host}:{port}: {what}") from None
    sock.set_inheritable(False)
    return sock


def run(home: Home, host: str, port: int, ready: Ready,
        cluster: ClusterOptions | None = None) -> int:
    """Serve until asked to stop; returns the exit code. ``ready`` is told once.
    ``cluster``: its place in a cluster, when ``$TROUPER_STORE`` is a shared store."""
    enter_private_process()
    install_log_masking()
    files = DaemonFiles(home)
    try:  # the user's file only: the daemon serves every project
        use_config_files(home.root, None)
    except ConfigError as exc:
        ready({"error": str(exc)})
        return 2
    stop = _Stop()
    with stop.installed():
        lock = HomeLock(files)
        if not lock.acquire():
            ready({"error": f"a daemon already runs for {home.root} "
                            f"(pid {_read_pid(files)})"})
            return 3
        try:
            return _serve_locked(home, files, host, port, ready, stop,
                                 cluster or ClusterOptions())
        except (DaemonError, ConfigError) as exc:
            ready({"error": str(exc)})
            return 3
        except BaseException as exc:
            logger.exception("the daemon failed")
            ready({"error": f"the daemon failed: {type(exc).__name__}: {exc}"})
            raise
        finally:
            clear_running(files)
            lock.release()


def _serve_locked(home: Home, files: DaemonFiles, host: str, port: int, ready: Ready,
                  stop: _Stop, cluster: ClusterOptions) -> int:
    from ..client.embedded import Trouper
    from ..store import is_shared, shown_url, store_url
    from .app import create_app, http_limits

    sock = bind(host, port)
    member = None
    try:
        port = sock.getsockname()[1]
        url_host = f"[{host}]" if ":" in host else host
        url = f"http://{url_host}:{port}"
        if host not in ("127.0.0.1", "::1", "localhost"):
            logger.warning("listening on %s:%d, not only on loopback: anyone who can reach "
                           "it and has the token drives your sessions", host, port)
        store = store_url(home)
        if is_shared(store):
            member = cluster_setup.join(home, store, cluster, url)
            token = cluster_setup.use_cluster_token(files.token, member)
            logger.info("cluster: store %s", shown_url(store))
        else:
            token = ensure_token(files)
        started = time.monotonic()
        service: list[Any] = []  # the app's Service, once made: it places what it starts

        def open_trouper() -> Trouper:
            # in a cluster a new root (after one died) resumes this daemon's sessions only
            mine = None if member is None else member.runs
            return Trouper(home=home.root, resume=member is None, mine=mine,
                           placed=lambda sid, cfg: service[0].placed(sid, cfg))

        trouper = open_trouper()
        logger.info("actor system open, unfinished sessions restored in %.2f s",
                    time.monotonic() - started)
        try:
            limits = http_limits()
            app = create_app(trouper, token=token, hosts=_hosts(host, port), http=limits,
                             member=member)
            service.append(app.fastapi.state.service)
            if member is not None:
                member.restore = trouper.restore
                cluster_setup.Fencing(open_trouper, service[0], member)
                member.serve(service[0].handle_call)
            streams = app.fastapi.state.streams
            config = uvicorn.Config(app, log_config=None, lifespan="off",
                                    timeout_graceful_shutdown=5, **uvicorn_options(limits))
            server = _Server(config)
            server.on_exit = streams.close_all  # type: ignore[method-assign]
            stop.server = server
            info = {"url": url, "pid": os.getpid(), "host": host, "port": port,
                    "home": str(home.root), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    **({"cluster": member.name} if member is not None else {})}
            if stop.requested:
                return 0
            asyncio.run(_serve(server, sock, lambda: _published(files, info, ready)))
        finally:
            current = service[0].tree if service else trouper  # a fenced daemon's new one
            if member is not None:
                logger.info("closing: the sessions go to the cluster's other daemons")
                cluster_setup.drain(member, current)
                member = None
            else:
                logger.info("closing: the actors stop, the sandboxes and sessions stay")
                current.close(stop_sandboxes=False)
    finally:
        if member is not None:  # joined, but the actor system never opened
            member.close()
        sock.close()
    logger.info("daemon stopped")
    return 0


def uvicorn_options(limits: HttpLimits) -> dict[str, Any]:
    """uvicorn's settings for the daemon's limits: the guarded h11 protocol (connections
    and read deadlines), the header cap, and WebSocket messages kept small (the daemon
    reads and ignores what a client sends on its stream)."""
    door = Door(limits, limit_error_body, Notes(logger))
    return {"http": guarded_protocol(door), "ws": "websockets-sansio",
            "h11_max_incomplete_event_size": limits.max_header_bytes,
            "timeout_keep_alive": limits.keep_alive_s, "ws_max_size": 64 * 1024}


def _hosts(host: str, port: int) -> frozenset[str]:
    """The Host values the daemon answers: its own address's, and the names in
    ``TROUPER_DAEMON_ALLOWED_HOSTS`` (comma-separated; ``name`` or ``name:port``), which a
    daemon on ``0.0.0.0`` needs (clients name it by an address or a DNS name)."""
    extra = [h.strip() for h in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if h.strip()]
    return allowed_hosts(host, port) | {_with_port(name, port) for name in extra}


def _with_port(name: str, port: int) -> str:
    head, sep, tail = name.lower().rpartition(":")
    if sep and tail.isdigit() and (":" not in head or head.endswith("]")):
        return name.lower()  # name:port, [v6]:port
    return f"{name.lower()}:{port}"


def _published(files: DaemonFiles, info: dict[str, Any], ready: Ready) -> None:
    write_running(files, info)
    logger.info("daemon serving %s for %s (pid %d)", info["url"], info["home"], info["pid"])
    ready(info)


async def _serve(server: _Server, sock: socket.socket, on_started: Callable[[], None]) -> None:
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        on_started()
    await task


class _Stop:
    """SIGTERM and SIGINT: ask the server to exit (or, before it runs, not to start)."""

    def __init__(self) -> None:
        self.requested = False
        self.server: _Server | None = None
        self._pid = os.getpid()

    @contextmanager
    def installed(self) -> Any:
        with signal_handlers((signal.SIGTERM, signal.SIGINT), self._on_signal):
            yield self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if die_if_forked(self._pid, signum):
            return
        logger.info("%s: stopping", signal.Signals(signum).name)
        self.requested = True
        if self.server is not None:
            self.server.request_exit()


def _read_pid(files: DaemonFiles) -> str:
    try:
        return files.pid.read_text().strip() or "?"
    except OSError:
        return "?"


def ready_writer(fd: int | None) -> Ready:
    """A ``Ready`` writing one JSON line to ``fd`` (the starter's pipe), then closing it;
    without a pipe, a line on stderr."""
    told = False

    def tell(message: dict[str, Any]) -> None:
        nonlocal told
        if told:
            return
        told = True
        line = json.dumps(message) + "\n"
        if fd is None:
            print(f"trouper daemon: {message.get('error') or 'serving ' + message['url']}",
                  file=sys.stderr, flush=True)
            return
        try:
            os.write(fd, line.encode())
            os.close(fd)
        except OSError:
            pass

    return tell


def log_to_stderr(debug: bool = False) -> None:
    """The daemon's log lines, on stderr (the starter points it at ``daemon.log``): text,
    or JSON naming this process ``daemon`` (``TROUPER_LOG_FORMAT``)."""
    from ..home.logs import line_formatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(line_formatter("daemon"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.WARNING)
    for name in ("trouper", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.INFO)


__all__ = ["LOOPBACK_NAMES", "DaemonError", "bind", "log_to_stderr", "ready_writer", "run"]
