"""The sandbox's HTTP API on loopback, with bearer-token auth and an idle watchdog.

Endpoints (JSON in and out; every request carries ``Authorization: Bearer <token>``)::

    GET  /alive                        -> {pid, boot_id, epoch, shell_pid, protocol}
    POST /claim     {epoch | "next"}   -> {epoch}            409 StaleEpoch if older
    POST /execute   {action_id, epoch, action, timeout_s, no_output_timeout_s[, wait_s]}
                    -> the journal record, after waiting up to wait_s for the outcome
                                       -> the action's journal record (runs it at most once)
    GET  /actions/<id>?wait_s=N&epoch=E -> the journal record, long-polled while running
    POST /shutdown  {epoch?}           -> {ok}; then kills the shell and exits

A record is ``{action_id, state, epoch, outcome}`` with state absent / running /
finished / unknown. Errors are ``{"error": <class name>, "message", "traceback"}``:
401 Unauthorized, 400 BadRequest, 404 NotFound, 409 StaleEpoch, 411 LengthRequired,
413 PayloadTooLarge, 500 anything else (secret values masked in every one).

What a client that is not trouper can cost the server: the token is checked (in constant
time) from the headers, before a byte of body is read; a request without it gets 401 and
the connection is closed unread. The headers of a request, then its body, must each
arrive within ``read_timeout_s`` in total (a slowloris is dropped), a body is never read
past its ``Content-Length`` nor over ``MAX_BODY_BYTES``, and at most ``max_connections``
connections are served at once (more are closed at once). Each kind of trouble is
logged at most once a minute per client address.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import os
import selectors
import socket
import socketserver
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from . import MAX_BODY_BYTES, PROTOCOL_VERSION
from .httpio import DeadlineReader, Refusal, body_length
from .logs import OncePer
from .service import BadRequest, Service, StaleEpoch, StorageUnavailable

logger = logging.getLogger(__name__)

MAX_WAIT_S = 60.0
"""Longest long-poll a request may ask for."""
READ_TIMEOUT_S = 10.0
"""Time a client has to send a request's headers (from when the server waits for them,
keep-alive idling included), then again for its body."""
WRITE_TIMEOUT_S = 30.0
"""Longest a reply may wait for a client that does not read it."""
MAX_CONNECTIONS = 64
"""Connections served at once; more are closed as they come."""
LOG_PERIOD_S = 60.0
"""A kind of trouble from one client address is logged at most once per this period."""


class NotFound(Exception):
    """No such endpoint."""


class SandboxServer(ThreadingHTTPServer):
    """The HTTP server of one sandbox; exits when told to or when idle too long."""

    daemon_threads = True
    request_queue_size = MAX_CONNECTIONS

    def __init__(
        self,
        address: tuple[str, int],
        service: Service,
        token: str,
        idle_timeout_s: float,
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__(address, _Handler)
        self.service = service
        self.token = token
        self.idle_timeout_s = idle_timeout_s
        self.read_timeout_s = read_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_connections = max_connections
        self._once = OncePer(LOG_PERIOD_S)
        self._activity_lock = threading.Lock()
        self._active = 0
        self._last_activity = time.monotonic()
        self._stopping = threading.Event()
        self._serving = threading.Event()
        self._served = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        """Written by ``shutdown``: wakes ``serve_forever``'s select, which has no timeout."""

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve a connection in a thread, unless ``max_connections`` already are."""
        if not self._slots.acquire(blocking=False):
            self.note("too many connections", client_address, f"{self._max_connections} are "
                      "open already; closed this one at once")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection failed outside a request's own handling (a reset, say)."""
        error = sys.exc_info()[1]
        self.note("connection error", client_address, f"{type(error).__name__}: {error}")

    def note(self, kind: str, client_address: Any, detail: str) -> None:
        """Log trouble from a client, at most once per ``LOG_PERIOD_S`` per address."""
        host = str(client_address[0]) if isinstance(client_address, tuple) else "?"
        skipped = self._once.due(f"{kind} {host}")
        if skipped is None:
            return
        more = f" (and {skipped} more since the last such line)" if skipped else ""
        logger.warning("%s from %s: %s%s; logged at most once per %.0f s per address",
                       kind, host, detail, more, LOG_PERIOD_S)

    def server_bind(self) -> None:
        """Bind without ``HTTPServer``'s ``getfqdn``: a reverse DNS lookup of the loopback
        address (and an import of the ``idna`` codec) in every new server, for a name
        nothing here reads (a third of a forked server's start)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self.server_address[1])

    def enter(self) -> None:
        """A request arrived."""
        with self._activity_lock:
            self._active += 1
            self._last_activity = time.monotonic()

    def leave(self) -> None:
        """A request was answered."""
        with self._activity_lock:
            self._active -= 1
            self._last_activity = time.monotonic()

    def idle_s(self) -> float:
        """Seconds since the last request ended (0 while one is in progress)."""
        with self._activity_lock:
            return 0.0 if self._active else time.monotonic() - self._last_activity

    def watch_idle(self) -> None:
        """Stop the server once no request came for ``idle_timeout_s`` (run in a thread).
        It wakes when the timeout could be due, never on a period: an idle sandbox costs
        no CPU."""
        while not self._stopping.wait(max(0.05, self.idle_timeout_s - self.idle_s())):
            if self.idle_s() >= self.idle_timeout_s:
                logger.warning("no request for %.1f s: shutting down", self.idle_timeout_s)
                self.stop()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until ``shutdown``. The select has no timeout (``poll_interval`` is
        ignored): it wakes for a connection or for ``shutdown``'s byte on a pipe, so an
        idle server never wakes up to poll."""
        self._serving.set()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._stopping.is_set():
                    for key, _ in selector.select():
                        if key.fileobj is self and not self._stopping.is_set():
                            self._handle_request_noblock()
        finally:
            self._served.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait for it to return (from another thread)."""
        self._stopping.set()
        os.write(self._wake_w, b"x")
        if self._serving.is_set():
            self._served.wait()

    def server_close(self) -> None:
        super().server_close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def stop(self) -> None:
        """Kill the shell and stop serving (idempotent; never call from serve_forever)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.service.close()
        self.shutdown()

    def stop_soon(self) -> None:
        """``stop`` from another thread, so the caller can finish its reply."""
        threading.Thread(target=self.stop, name="sandbox-stop", daemon=True).start()

    def route(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        """The answer to one authorized request."""
        service = self.service
        if method == "GET" and path == "/alive":
            return {
                "pid": os.getpid(),
                "boot_id": service.journal.boot_id,
                "epoch": service.epoch,
                "shell_pid": service.shell.pid,
                "protocol": PROTOCOL_VERSION,
            }
        if method == "GET" and path.startswith("/actions/"):
            service.check_epoch(_query_int(query, "epoch"))
            wait_s = min(MAX_WAIT_S, _query_float(query, "wait_s", 0.0))
            return service.journal.wait(unquote(path[len("/actions/") :]), wait_s)
        if method == "POST" and path == "/claim":
            return {"epoch": service.claim(_body(body).get("epoch"))}
        if method == "POST" and path == "/execute":
            request = _body(body)
            record = service.execute(request)
            wait_s = min(MAX_WAIT_S, _number(request.get("wait_s") or 0.0, "wait_s"))
            if record.get("state") == "running" and wait_s > 0:
                # answer with the outcome when it comes soon: one request per quick action
                record = service.journal.wait(record["action_id"], wait_s)
            return record
        if method == "POST" and path == "/shutdown":
            service.check_epoch(_body(body).get("epoch"))
            self.stop_soon()
            return {"ok": True}
        raise NotFound(f"no endpoint {method} {path}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    """Headers and body go out in two writes: without this, delayed ACKs add 40 ms."""
    server: SandboxServer

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self._reader = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)  # type: ignore[assignment]

    def handle_one_request(self) -> None:
        # the request line and headers, from now on, must all arrive within the timeout
        self._reader.start(self.server.read_timeout_s)
        super().handle_one_request()

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("%s " + format, self.address_string(), *args)

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        """Timeouts and malformed requests, as http.server reports them."""
        if self._reader.received == 0:  # an idle keep-alive connection expired: normal
            logger.debug("%s: %s", self.address_string(), format % args)
            return
        self.server.note("bad or slow request", self.client_address, format % args)

    def _handle(self, method: str) -> None:
        if not self._authorized():
            self.server.note("unauthorized request", self.client_address,
                             f"{method} {self.path[:100]}, refused with 401 unread")
            self._refuse(Refusal(401, "Unauthorized", "missing or wrong bearer token"))
            return
        try:
            length = body_length(self.headers, method, MAX_BODY_BYTES)
        except Refusal as e:
            self.server.note("refused request", self.client_address, f"{e.status} {e}")
            self._refuse(e)
            return
        raw = self._read_body(length)
        if raw is None:
            return
        self.server.enter()
        try:
            self._answer(method, raw)
        finally:
            self.server.leave()

    def _answer(self, method: str, raw: bytes) -> None:
        try:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            self._reply(200, self.server.route(method, url.path, query, _parse_json(raw)))
        except StaleEpoch as e:
            self._reply(409, self._error("StaleEpoch", str(e)))
        except StorageUnavailable as e:  # 507 Insufficient Storage: nothing was run
            self._reply(507, self._error("StorageUnavailable", str(e)))
        except BadRequest as e:
            self._reply(400, self._error("BadRequest", str(e)))
        except NotFound as e:
            self._reply(404, self._error("NotFound", str(e)))
        except (socket.timeout, ConnectionError):
            self.close_connection = True  # the client left or stopped reading
        except Exception as e:  # noqa: BLE001 - every failure crosses HTTP as data
            logger.exception("%s %s failed", method, self.path)
            self._reply(500, self._error(type(e).__name__, str(e), traceback.format_exc()))

    def _read_body(self, length: int) -> bytes | None:
        """Exactly ``length`` bytes, or None (connection to close) when they do not all
        arrive within the read timeout."""
        if length == 0:
            return b""
        self._reader.start(self.server.read_timeout_s)
        try:
            raw = self.rfile.read(length)
        except (socket.timeout, ConnectionError) as e:
            raw, why = b"", f"{type(e).__name__}: {e}"
        else:
            why = f"only {len(raw)} of {length} body bytes came"
        if len(raw) == length:
            return raw
        self.server.note("slow or cut body", self.client_address, why)
        self.close_connection = True
        return None

    def _authorized(self) -> bool:
        given = (self.headers.get("Authorization") or "").encode("utf-8", "surrogateescape")
        return hmac.compare_digest(given, f"Bearer {self.server.token}".encode())

    def _refuse(self, refusal: Refusal) -> None:
        """Answer from the headers alone and close: the body, if any, is never read."""
        self._reply(refusal.status, self._error(refusal.name, str(refusal)), close=True)

    def _error(self, name: str, message: str, trace: str = "") -> dict[str, str]:
        mask = self.server.service.masker.mask
        return {"error": name, "message": mask(message), "traceback": mask(trace)}

    def _reply(self, status: int, payload: Any, close: bool = False) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.connection.settimeout(WRITE_TIMEOUT_S)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{name} must be a number")
    return float(value)


def _query_float(query: dict[str, str], name: str, default: float) -> float:
    try:
        return float(query.get(name, default))
    except ValueError as e:
        raise BadRequest(f"{name} must be a number") from e


def _query_int(query: dict[str, str], name: str) -> int | None:
    if name not in query:
        return None
    try:
        return int(query[name])
    except ValueError as e:
        raise BadRequest(f"{name} must be an integer") from e


def _parse_json(raw: bytes) -> Any:
    if not raw:
        return {}
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise BadRequest(f"the request body is not JSON: {e}") from e
