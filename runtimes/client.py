"""``SandboxClient``: the ``Runtime`` of a sandbox server, over HTTP on loopback.

Stdlib ``http.client`` with keep-alive connections (one per concurrent caller) and a
deadline on every call. Errors map onto trouper's exceptions: 409 -> ``StaleEpoch``,
400/411/413 -> ``InvalidRequest``, anything else that goes wrong -> ``RuntimeUnavailable``
naming the operation and the address, with the cause chained. An action too large for
the server's body cap is not sent: it gets a ``rejected`` outcome the agent can act on
(the server would close the connection unread, and the client would see only a reset).

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

from ..exceptions import InvalidRequest, RuntimeUnavailable, StaleEpoch, StoreUnavailable
from ..messages.actions import RuntimeAction
from ..messages.outcomes import Outcome
from .base import JournalRecord
from .sandbox import MAX_BODY_BYTES

logger = logging.getLogger(__name__)

_OUTCOME_FIELDS = frozenset(Outcome.model_fields)
_STOP_MARGIN_S = 60.0
"""Time past an action's hard timeout allowed for the kill, a shell restart and the reply."""
KEEPALIVE_S = 8.0
"""A kept-alive connection idle for longer is not reused: the server closes one idle for
10 s (``READ_TIMEOUT_S``), and a request sent on it would fail and be sent again."""


class SandboxClient:
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
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        """Kept-alive connections and when each was last used (monotonic)."""
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """``host:port`` of the server."""
        return f"{self.host}:{self.port}"

    # ---- Runtime ----

    def execute(
        self,
        action_id: str,
        action: RuntimeAction,
        *,
        timeout_s: float,
        no_output_timeout_s: float,
    ) -> Outcome:
        """Run ``action`` once (idempotent by ``action_id``) and return its outcome."""
        hard_s = getattr(action, "timeout_s", None) or timeout_s
        deadline = time.monotonic() + hard_s + _STOP_MARGIN_S
        body = {
            "action_id": action_id,
            "epoch": self.epoch,
            "action": action.model_dump(mode="json"),
            "timeout_s": timeout_s,
            "no_output_timeout_s": no_output_timeout_s,
            "wait_s": min(self.poll_s, hard_s + _STOP_MARGIN_S),
        }
        size = len(json.dumps(body).encode("utf-8"))
        if size > MAX_BODY_BYTES:
            return _too_large(size)
        record = self._call("POST", "/execute", body, operation=f"execute {action_id}",
                            timeout_s=body["wait_s"] + self.request_timeout_s)
        while record.get("state") == "running":
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise RuntimeUnavailable(
                    f"execute {action_id}: no outcome from the sandbox at {self.address} "
                    f"within {hard_s + _STOP_MARGIN_S:g} s (its timeout plus {_STOP_MARGIN_S:g} s)"
                )
            record = self._poll(action_id, min(self.poll_s, remaining_s), f"execute {action_id}")
        return self._record(record, f"execute {action_id}").outcome or _lost(record)

    def resolve(self, action_id: str, *, wait_s: float = 0.0) -> JournalRecord:
        """What the journal knows of ``action_id``, waiting up to ``wait_s`` while it runs."""
        deadline = time.monotonic() + wait_s
        record = self._poll(action_id, min(self.poll_s, wait_s), f"resolve {action_id}")
        while record.get("state") == "running" and time.monotonic() < deadline:
            wait_s = min(self.poll_s, deadline - time.monotonic())
            record = self._poll(action_id, wait_s, f"resolve {action_id}")
        return self._record(record, f"resolve {action_id}")

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

    def _poll(self, action_id: str, wait_s: float, operation: str) -> dict[str, Any]:
        wait_s = max(0.0, wait_s)
        path = f"/actions/{quote(action_id, safe='')}?wait_s={wait_s:.3f}"
        if self.epoch is not None:
            path += f"&epoch={self.epoch}"
        timeout_s = wait_s + self.request_timeout_s
        return self._call("GET", path, None, operation=operation, timeout_s=timeout_s)

    def _record(self, record: dict[str, Any], operation: str) -> JournalRecord:
        try:
            outcome = record.get("outcome")
            return JournalRecord(
                action_id=record["action_id"],
                state=record["state"],
                epoch=int(record.get("epoch") or 0),
                outcome=_outcome(outcome) if outcome is not None else None,
            )
        except (KeyError, ValueError, TypeError) as e:
            raise RuntimeUnavailable(
                f"{operation}: the sandbox at {self.address} sent a bad record: {record!r}"
            ) from e

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
                if conn is not None:
                    conn.close()
                if reused and attempt == 1 and not isinstance(e, TimeoutError):
                    continue  # a kept-alive connection the server had closed: try a fresh one
                raise RuntimeUnavailable(
                    f"{operation}: cannot reach the sandbox at {self.address}: "
                    f"{type(e).__name__}: {e}"
                ) from e
            self._release(conn, response)
            return self._decode(response.status, payload, operation)
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

    def _decode(self, status: int, payload: bytes, operation: str) -> dict[str, Any]:
        try:
            answer = json.loads(payload.decode("utf-8"))
        except ValueError as e:
            raise RuntimeUnavailable(
                f"{operation}: the sandbox at {self.address} answered {status} with non-JSON"
            ) from e
        if status == 200 and isinstance(answer, dict):
            return answer
        error = answer.get("error", "Error") if isinstance(answer, dict) else "Error"
        message = answer.get("message", "") if isinstance(answer, dict) else str(answer)
        text = f"{operation}: the sandbox at {self.address} answered {status} {error}: {message}"
        if status == 409:
            raise StaleEpoch(text)
        if status in (400, 411, 413):
            raise InvalidRequest(text)
        if status == 507:
            raise StoreUnavailable(message or text, "full")
        exc = RuntimeUnavailable(text)
        exc.remote_traceback = answer.get("traceback", "") if isinstance(answer, dict) else ""  # type: ignore[attr-defined]
        raise exc


def _outcome(data: dict[str, Any]) -> Outcome:
    return Outcome.model_validate({k: v for k, v in data.items() if k in _OUTCOME_FIELDS})


def _too_large(size: int) -> Outcome:
    return Outcome(
        status="rejected",
        content=(
            f"This action was not run: it is too large to send to the sandbox ({size} bytes "
            f"as JSON, limit {MAX_BODY_BYTES}). Write a large file in parts (several "
            "smaller write_file or edit_file calls), or generate it with run."
        ),
    )


def _lost(record: dict[str, Any]) -> Outcome:
    if record.get("state") == "unknown":
        return Outcome(
            status="lost",
            content=(
                "This action started in a sandbox that has since restarted; nobody can know "
                "how it ended, so it is not run again."
            ),
        )
    raise RuntimeUnavailable(
        f"execute {record.get('action_id')}: unexpected journal state {record.get('state')!r}"
    )
