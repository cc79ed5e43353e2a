"""``SandboxClient``: the ``Runtime`` of a sandbox server, over HTTP on loopback.

The actions (execute, resolve, the long-polls, the journal's records) are
``action_calls.ActionCalls``, shared with the remote runtime's client; this module is the
transport: stdlib ``http.client`` with keep-alive connections (one per concurrent
caller), a deadline on every call, the server's paths (``POST /execute``,
``GET /actions/<id>?wait_s=&epoch=``) and its lifecycle calls (claim, alive, shutdown).
Every failure maps onto trouper's exceptions through ``call_failures`` (409
``StaleEpoch``, 400/411/413 ``InvalidRequest``, anything else a ``SandboxUnavailable``
naming the operation and the address, with its typed cause and the cause chained).

    client = SandboxClient("127.0.0.1", port, token, epoch=3)
    outcome = client.execute("a1", RunCommand(command="ls"), timeout_s=60, no_output_timeout_s=10)
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from typing import Any
from urllib.parse import quote

from .action_calls import ActionCalls
from .call_failures import answer_json, unreachable
from .sandbox import MAX_BODY_BYTES

logger = logging.getLogger(__name__)

KEEPALIVE_S = 8.0
"""A kept-alive connection idle for longer is not reused: the server closes one idle for
10 s (``READ_TIMEOUT_S``), and a request sent on it would fail and be sent again."""


class SandboxClient(ActionCalls):
    """Talks to one sandbox server boot; every request carries ``epoch``."""

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        epoch: int | None,
        *,
        request_timeout_s: float = 10.0,
        poll_s: float = 20.0,
    ) -> None:
        self.host = host
        self.port = port
        self.epoch = epoch
        """The epoch sent with requests; ``None`` only for a client that shuts a server down."""
        self.request_timeout_s = request_timeout_s
        """Limit for one request that does not long-poll."""
        self.poll_s = poll_s
        """Longest single long-poll while waiting for an action."""
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.max_body_bytes = MAX_BODY_BYTES  # read here, so a test can lower it
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        """Kept-alive connections and when each was last used (monotonic)."""
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """``host:port`` of the server."""
        return f"{self.host}:{self.port}"

    @property
    def where(self) -> str:
        return f"the sandbox at {self.address}"

    # ---- lifecycle calls (used by the Sandbox backends) ----

    def claim(self) -> int:
        """Claim the sandbox for this client's epoch; raises StaleEpoch if a newer one holds
        it. A client made with no epoch claims the next one the server counts, and keeps it."""
        wanted: int | str = "next" if self.epoch is None else self.epoch
        answer = self._call("POST", "/claim", {"epoch": wanted}, operation="claim")
        self.epoch = int(answer["epoch"])
        return self.epoch

    def alive(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """The server's ``/alive`` answer (pid, boot_id, epoch, shell_pid)."""
        return self._call("GET", "/alive", None, operation="alive", timeout_s=timeout_s)

    def shutdown(self, timeout_s: float = 3.0) -> None:
        """Ask the server to kill its shell and exit."""
        body = {} if self.epoch is None else {"epoch": self.epoch}
        self._call("POST", "/shutdown", body, operation="shutdown", timeout_s=timeout_s)

    def close(self) -> None:
        """Close the idle connections (idempotent)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    # ---- HTTP ----

    def _send_action(self, body: dict[str, Any], *, timeout_s: float,
                     operation: str) -> dict[str, Any]:
        return self._call("POST", "/execute", body, operation=operation, timeout_s=timeout_s)

    def _fetch_record(self, action_id: str, wait_s: float, *, timeout_s: float,
                      operation: str) -> dict[str, Any]:
        path = f"/actions/{quote(action_id, safe='')}?wait_s={wait_s:.3f}"
        if self.epoch is not None:
            path += f"&epoch={self.epoch}"
        return self._call("GET", path, None, operation=operation, timeout_s=timeout_s)

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        operation: str,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        for attempt in (1, 2):
            conn: http.client.HTTPConnection | None = None
            reused = False
            try:
                conn, reused = self._acquire(timeout_s)
                conn.request(method, path, body=data, headers=self._headers)
                response = conn.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException) as e:
                timed_out = conn is not None and isinstance(e, TimeoutError)
                if conn is not None:
                    conn.close()
                if reused and attempt == 1 and not timed_out:
                    continue  # a kept-alive connection the server had closed: try a fresh one
                raise unreachable(self.where, operation, e, timed_out=timed_out) from e
            self._release(conn, response)
            return answer_json(self.where, operation, response.status, payload)
        raise AssertionError("unreachable")

    def _acquire(self, timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        now, conn, stale = time.monotonic(), None, []
        with self._lock:
            while self._idle and conn is None:
                conn, used_at = self._idle.pop()
                if now - used_at > KEEPALIVE_S:  # the server has closed it, or is about to
                    stale.append(conn)
                    conn = None
        for old in stale:
            old.close()
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
            try:
                conn.connect()
            except OSError:
                conn.close()
                raise
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn, False
        conn.timeout = timeout_s
        conn.sock.settimeout(timeout_s)
        return conn, True

    def _release(
        self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse
    ) -> None:
        if response.will_close:
            conn.close()
            return
        with self._lock:
            self._idle.append((conn, time.monotonic()))
