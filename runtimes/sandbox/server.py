"""The sandbox's HTTP API on loopback, with bearer-token auth and an idle watchdog.

Endpoints (JSON in and out; every request carries ``Authorization: Bearer <token>``)::

    GET  /alive                        -> {pid, boot_id, epoch, shell_pid, protocol}
    POST /claim     {epoch}            -> {epoch}            409 StaleEpoch if older
    POST /execute   {action_id, epoch, action, timeout_s, no_output_timeout_s[, wait_s]}
                    -> the journal record, after waiting up to wait_s for the outcome
                                       -> the action's journal record (runs it at most once)
    GET  /actions/<id>?wait_s=N&epoch=E -> the journal record, long-polled while running
    POST /shutdown  {epoch?}           -> {ok}; then kills the shell and exits

A record is ``{action_id, state, epoch, outcome}`` with state absent / running /
finished / unknown. Errors are ``{"error": <class name>, "message", "traceback"}``:
401 Unauthorized, 400 BadRequest, 404 NotFound, 409 StaleEpoch, 500 anything else.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from . import PROTOCOL_VERSION
from .service import BadRequest, Service, StaleEpoch

logger = logging.getLogger(__name__)

MAX_WAIT_S = 60.0
"""Longest long-poll a request may ask for."""
MAX_BODY_BYTES = 64 * 1024 * 1024


class NotFound(Exception):
    """No such endpoint."""


class SandboxServer(ThreadingHTTPServer):
    """The HTTP server of one sandbox; exits when told to or when idle too long."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], service: Service, token: str, idle_timeout_s: float
    ) -> None:
        super().__init__(address, _Handler)
        self.service = service
        self.token = token
        self.idle_timeout_s = idle_timeout_s
        self._activity_lock = threading.Lock()
        self._active = 0
        self._last_activity = time.monotonic()
        self._stopping = threading.Event()

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
        """Stop the server once no request came for ``idle_timeout_s`` (run in a thread)."""
        period_s = max(0.05, min(1.0, self.idle_timeout_s / 4))
        while not self._stopping.wait(period_s):
            if self.idle_s() >= self.idle_timeout_s:
                logger.warning("no request for %.1f s: shutting down", self.idle_timeout_s)
                self.stop()

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
            wait_s = min(MAX_WAIT_S, float(request.get("wait_s") or 0.0))
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

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("%s " + format, self.address_string(), *args)

    def _handle(self, method: str) -> None:
        self.server.enter()
        try:
            raw = self._read_body()
            if not self._authorized():
                self._reply(401, _error("Unauthorized", "missing or wrong bearer token"))
                return
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            body = _parse_json(raw)
            self._reply(200, self.server.route(method, url.path, query, body))
        except StaleEpoch as e:
            self._reply(409, _error("StaleEpoch", str(e)))
        except BadRequest as e:
            self._reply(400, _error("BadRequest", str(e)))
        except NotFound as e:
            self._reply(404, _error("NotFound", str(e)))
        except Exception as e:  # noqa: BLE001 - every failure crosses HTTP as data
            logger.exception("%s %s failed", method, self.path)
            self._reply(500, _error(type(e).__name__, str(e), traceback.format_exc()))
        finally:
            self.server.leave()

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise BadRequest(f"body too large ({length} bytes)")
        return self.rfile.read(length) if length > 0 else b""

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization") or ""
        return hmac.compare_digest(given.encode("utf-8"), f"Bearer {self.server.token}".encode())

    def _reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _error(name: str, message: str, trace: str = "") -> dict[str, str]:
    return {"error": name, "message": message, "traceback": trace}


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


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
