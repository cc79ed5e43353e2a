"""Running the runtime server: checks first, then uvicorn on a socket bound here.

``serve`` refuses, with a message saying what to do, before anything listens: a token
file that is missing, empty, short or readable by other users; a TLS certificate
without its key; and an address beyond loopback without TLS, unless ``insecure``. It
holds ``<workdir>/server.lock`` (one server per workdir), kills the shells a SIGKILLed
earlier boot left behind, writes ``<workdir>/server.json`` (pid, host, port, boot id; no
token; 0600) once it listens, and stops every session's shell when it exits.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from ...serving.limits import HttpLimits
from ..sandbox import MAX_BODY_BYTES
from ..sandbox.util import open_private, wall_time, write_json_atomic
from .guard import MAX_HEADER_BYTES
from .shell_rules import ShellRules

MAX_CONNECTIONS = 512
"""Connections open at once; more are answered 503 and closed at once."""
MAX_CONNECTIONS_PER_CLIENT = 256
"""Connections open at once from one address (a trouper host's sessions each hold one
while they wait on an action)."""
READ_TIMEOUT_S = 10.0
"""A request's headers must arrive within this; its body too, plus a second per 16 KiB."""
KEEP_ALIVE_S = 30.0
"""An idle connection between requests is kept this long (a client's pool reuses it)."""

logger = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16


class ServeError(Exception):
    """The server cannot start as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ServeOptions:
    """What ``trouper runtime-server`` was given."""

    host: str
    port: int
    workdir: Path
    token_file: Path
    tls_cert: Path | None = None
    tls_key: Path | None = None
    insecure: bool = False
    idle_timeout_s: float = 0.0
    max_output_chars: int = 10_000
    log_level: str = "info"
    max_body_bytes: int = MAX_BODY_BYTES
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    read_timeout_s: float = READ_TIMEOUT_S
    network: bool = True
    """Whether the sessions' shells may open network sockets."""
    unreadable: tuple[str, ...] = ()
    """More paths no shell may read (beside the workdir, the token and TLS key files and
    the usual credential stores)."""
    writable: tuple[str, ...] = ()
    """More folders every shell may write (beside its workspace and the temporary ones)."""

    def shell_rules(self) -> ShellRules:
        """How the sessions' shells are confined."""
        secret_files = [str(p.expanduser().resolve()) for p in (self.token_file, self.tls_key)
                        if p is not None]
        return ShellRules(network=self.network, unreadable=self.unreadable,
                          writable=self.writable, secret_files=tuple(secret_files))

    def limits(self) -> HttpLimits:
        """What one client may cost the server."""
        return HttpLimits(
            max_body_bytes=self.max_body_bytes, max_header_bytes=MAX_HEADER_BYTES,
            header_timeout_s=self.read_timeout_s, body_timeout_s=self.read_timeout_s,
            keep_alive_s=KEEP_ALIVE_S, max_connections=self.max_connections,
            max_connections_per_client=self.max_connections_per_client)


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback one."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def check_listen(host: str, tls: bool, insecure: bool) -> None:
    """Refuse to listen beyond loopback in clear text unless told to (``insecure``)."""
    if is_loopback(host) or tls or insecure:
        return
    raise ServeError(
        f"refusing to listen on {host} without TLS: the bearer token and every command "
        "would cross the network in clear text. Give --tls-cert and --tls-key, listen on "
        "127.0.0.1 and reach it through a tunnel (ssh -L), or pass --insecure if the "
        "network is private and you accept the risk.")


def read_token_file(path: Path) -> str:
    """The token in ``path`` (surrounding whitespace dropped)."""
    try:
        info = path.stat()
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError as e:
        raise ServeError(f"token file {path} does not exist; make one with: "
                         f"python3 -c 'import secrets; print(secrets.token_urlsafe(32))' "
                         f"> {path} && chmod 600 {path}") from e
    except (OSError, UnicodeError) as e:
        raise ServeError(f"cannot read the token file {path}: {e}") from e
    if info.st_mode & 0o007:
        raise ServeError(f"token file {path} is open to other users (mode "
                         f"{info.st_mode & 0o777:03o}); chmod 600 {path}")
    if len(text) < MIN_TOKEN_CHARS or any(c.isspace() for c in text):
        raise ServeError(f"token file {path} must hold one token of at least "
                         f"{MIN_TOKEN_CHARS} characters without spaces")
    return text


def check_tls(cert: Path | None, key: Path | None) -> bool:
    """Whether TLS is on; both files or neither."""
    if (cert is None) != (key is None):
        raise ServeError("--tls-cert and --tls-key go together: give both or neither")
    for path in (cert, key):
        if path is not None and not path.is_file():
            raise ServeError(f"TLS file {path} does not exist")
    return cert is not None


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (SO_REUSEADDR: a restarted server gets its port back at once)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    sock.listen(512)
    sock.set_inheritable(False)
    return sock


def lock_workdir(workdir: Path) -> int:
    """Hold ``<workdir>/server.lock``; ServeError when another server holds it."""
    fd = open_private(str(workdir / "server.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise ServeError(f"another runtime server uses {workdir}") from e
        raise
    return fd


def serve(options: ServeOptions) -> None:
    """Check, bind, and serve until SIGTERM or SIGINT; raises ServeError before listening."""
    import uvicorn

    from ...serving.limits import Notes
    from ...serving.protocol import Door, guarded_protocol
    from .app import create_app
    from .guard import limit_error_body
    from .registry import Sessions

    tls = check_tls(options.tls_cert, options.tls_key)
    check_listen(options.host, tls, options.insecure)
    token = read_token_file(options.token_file)
    _log_masked(token, options.log_level)
    started_umask = os.umask(0o077)  # the server's files are owner-only; shells get this back
    workdir = options.workdir.expanduser().resolve()
    sessions = Sessions(workdir, token, shell_umask=started_umask,
                        idle_timeout_s=options.idle_timeout_s,
                        max_output_chars=options.max_output_chars,
                        shells=options.shell_rules())
    lock_fd = lock_workdir(workdir)
    killed = sessions.kill_leftovers()
    if killed:
        logger.warning("killed %d shell(s) an earlier server boot left: %s", len(killed), killed)
    sock = bind(options.host, options.port)
    port = sock.getsockname()[1]
    limits = options.limits()
    # a peer that opens connections without end, or trickles them, gets 503s and closed
    # connections, not the server's memory (serving/protocol.py)
    door = Door(limits, limit_error_body, Notes(logger))
    config = uvicorn.Config(
        create_app(sessions, token, limits.max_body_bytes), log_config=None,
        log_level=options.log_level, access_log=False,
        ssl_certfile=str(options.tls_cert) if tls else None,
        ssl_keyfile=str(options.tls_key) if tls else None,
        timeout_keep_alive=limits.keep_alive_s, timeout_graceful_shutdown=5, lifespan="on",
        http=guarded_protocol(door), h11_max_incomplete_event_size=limits.max_header_bytes)
    server = uvicorn.Server(config)
    scheme = "https" if tls else "http"
    write_json_atomic(str(workdir / "server.json"), {
        "pid": os.getpid(), "host": options.host, "port": port, "tls": tls,
        "boot_id": sessions.boot_id, "started_at": wall_time(),
        "url": f"{scheme}://{_url_host(options.host)}:{port}"})
    logger.warning("trouper runtime server %s listening on %s://%s:%d (workdir %s)",
                   sessions.boot_id, scheme, options.host, port, workdir)
    threading.Thread(target=sessions.watch_idle, name="idle", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        sessions.close()
        sock.close()
        try:
            (workdir / "server.json").unlink()
        except OSError:
            pass
        os.close(lock_fd)


def _log_masked(token: str, level: str) -> None:
    """Log to stderr, the token masked in every line (uvicorn's loggers included): text,
    or JSON lines naming this process ``runtime-server`` (``TROUPER_LOG_FORMAT``)."""
    from ...home.log_format import json_logs, set_log_role
    from ..sandbox.logs import JsonFormatter, MaskingFormatter
    from ..sandbox.mask import TextMasker
    from .registry import TOKEN_NAME

    masker = TextMasker({TOKEN_NAME: token})
    handler = logging.StreamHandler()
    if json_logs():
        set_log_role("runtime-server")
        handler.setFormatter(JsonFormatter(masker, role="runtime-server"))
    else:
        handler.setFormatter(MaskingFormatter(masker))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
