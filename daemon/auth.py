"""Who may talk to the daemon: a bearer token on every route, and only through the
daemon's own Host and Origin.

``Guard`` is the door both of trouper's servers use (``serving.token_guard.TokenGuard``,
ASGI middleware around the whole app, so a route added later is guarded without saying
so) with the daemon's own checks and error shape; only ``PUBLIC_PATHS`` (the static web
page, which holds no data and no token) are served without the token, and ``/metrics``
when ``TROUPER_METRICS_OPEN`` is set on a loopback-only daemon (``open_metrics``).
Checked, in order, on every HTTP request and every WebSocket handshake:

1. ``Host`` must name the daemon's own address (``127.0.0.1:PORT``, ``localhost:PORT``,
   ``[::1]:PORT``, or the ``--host`` it was given): a DNS-rebinding page whose name now
   points at 127.0.0.1 sends its own name and is refused (403 ``forbidden_host``).
2. ``Origin``, when sent (browsers send it on cross-site requests and on every
   WebSocket), must be the daemon's own origin: a web page on another site cannot drive
   the daemon from the user's browser (403 ``forbidden_origin``).
3. The token: ``Authorization: Bearer <token>``; a WebSocket may instead offer the
   subprotocol ``bearer.<token>`` (browsers cannot set headers on a WebSocket). Never a
   query parameter: URLs get logged. Missing or wrong: 401 ``unauthorized``.

A refusal is ``{"error": {"code", "message"}}``, answered from the headers with
``Connection: close``: the body of a refused request is never read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from ..config.settings import settings
from ..serving.limits import Notes
from ..serving.token_guard import ASGIApp, Refusal, Scope, TokenGuard

logger = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/", "/page/app.js", "/page/list.js", "/page/changes.js",
                          "/page/style.css"})
"""Served without the token: the web page's static files (no data, no token in them)."""
SUBPROTOCOL = "trouper.v1"
"""The WebSocket subprotocol the daemon speaks (answered when the client offers it)."""
TOKEN_PROTOCOL_PREFIX = "bearer."
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
METRICS_PATH = "/metrics"
"""Prometheus's text: behind the token, unless ``open_metrics`` says otherwise."""


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    """The Host header values that name this daemon."""
    names = set(LOOPBACK_NAMES)
    if host not in ("127.0.0.1", "localhost", "::1"):
        names.add(f"[{host}]" if ":" in host else host)
    return frozenset(f"{name}:{port}" for name in names)


class Guard(TokenGuard):
    """The daemon's door: ``serving.token_guard.TokenGuard`` with the Host and Origin
    checks first, the web page's files public, and the daemon's error shape."""

    def __init__(self, app: ASGIApp, *, token: str, hosts: Iterable[str]) -> None:
        self.hosts = frozenset(h.lower() for h in hosts)
        self.origins = frozenset(f"http://{h}" for h in self.hosts)
        super().__init__(app, token=token, render=_render, notes=Notes(logger),
                         message="a valid bearer token is required (see docs/daemon.md)",
                         before=(self._foreign_host, self._foreign_origin),
                         public_paths=PUBLIC_PATHS | open_metrics(self.hosts),
                         subprotocol_prefix=TOKEN_PROTOCOL_PREFIX)
        self.app = app

    def _foreign_host(self, scope: Scope, headers: dict[str, str]) -> Refusal | None:
        if headers.get("host", "").lower() in self.hosts:
            return None
        return Refusal(403, "forbidden_host", "the Host header does not name this daemon")

    def _foreign_origin(self, scope: Scope, headers: dict[str, str]) -> Refusal | None:
        origin = headers.get("origin")
        if origin is None or origin.lower() in self.origins:
            return None
        return Refusal(403, "forbidden_origin", "requests from another origin are refused")


def open_metrics(hosts: frozenset[str]) -> frozenset[str]:
    """``{METRICS_PATH}`` when ``TROUPER_METRICS_OPEN`` is set and every name the daemon
    answers to (``hosts``) is a loopback one: only then may a scraper without the token
    read it, and it reaches only counts (no session ids, no text). Else nothing."""
    if not settings().metrics_open:
        return frozenset()
    if hosts and all(h.rpartition(":")[0] in LOOPBACK_NAMES for h in hosts):
        return frozenset({METRICS_PATH})
    logger.warning("TROUPER_METRICS_OPEN is ignored: the daemon answers to names that are "
                   "not loopback (%s); /metrics keeps its token", ", ".join(sorted(hosts)))
    return frozenset()


def _render(refusal: Refusal) -> bytes:
    return error_body(refusal.kind, refusal.message)


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


LIMIT_CODES = {400: "bad_request", 413: "payload_too_large", 431: "headers_too_large",
               503: "too_many_connections"}
"""The error code of each refusal made from a request's size or its connection."""


def limit_error_body(status: int, message: str) -> bytes:
    """The daemon's error body for a request or connection refused by its limits."""
    return error_body(LIMIT_CODES.get(status, "http_error"), message)
