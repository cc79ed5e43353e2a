"""``RemoteSandbox``: a session's sandbox on a ``trouper runtime-server``, over HTTP(S).

The server hosts the sandbox by session id (``<workdir>/<session id>/workspace`` on its
machine, with the journal beside it); this client is ``Sandbox`` and ``Runtime`` over its
``/v1`` API (runtimes/remote_server/app.py), with the bearer token on every request.
``SessionConfig.workspace`` is not used: the agent works in the server's folder (copy
files in and out with ``upload`` and ``download``).

What it retries, and what it does not: ``start`` waits for the server to answer healthy
(up to ``RemoteRuntime.ready_timeout_s``, logging what it waits for), except when the
answer says no wait can help (a refused token, an address where no runtime server is:
``RuntimeMisconfigured`` at once); starting an action
and polling it are retried a few times on a dropped connection or a 502/503/504 (safe:
the server journals by action id, so a repeat never runs anything twice). Everything
else fails at once. Executing, resolving and long-polling are ``action_calls.ActionCalls``,
shared with the local sandbox server's client; failures map onto trouper's exceptions
through the same table (``call_failures``): 409 -> ``StaleEpoch``, 400/411/413/422 ->
``InvalidRequest``, 507 -> ``StoreUnavailable``; unreachable, refused, timed out, 401, a
sandbox that no longer runs and any other 5xx -> ``RemoteUnavailable`` (a
``RuntimeUnavailable``) whose ``cause`` is the typed ``RuntimeFailure``.

``kill`` (fault injection) asks the server to SIGKILL the session's shell and its jobs
and to drop the sandbox as a crash would: what was running reads ``unknown`` afterwards.

httpx is imported when the first client is made, so importing this module costs nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..exceptions import InvalidRequest, RuntimeUnavailable, StaleEpoch
from ..messages.causes import RuntimeFailure
from ..security.masking import remember_secrets
from ..security.tls import default_ssl_context
from .action_calls import ActionCalls
from .base import SandboxHealth
from .call_failures import answer_json, cause_of
from .remote_errors import RemoteUnavailable, checked_health, refused_at_start, unreachable

logger = logging.getLogger(__name__)

TOKEN_NAME = "TROUPER_RUNTIME_TOKEN"
"""The token's placeholder wherever it is masked."""
RETRIES = (0.2, 0.5, 1.0)
"""Waits before each retry of a safe request."""
_RETRY_STATUS = frozenset({502, 503, 504})
_NEVER = "never started"


class RemoteSandbox(ActionCalls):
    """One session's sandbox on a runtime server; its own ``runtime`` once started."""

    def __init__(
        self,
        session_id: str,
        workspace: Path | None = None,
        state_dir: Path | None = None,
        env: dict[str, str] | None = None,
        max_output_chars: int = 10_000,
        *,
        secret_names: tuple[str, ...] | None = None,
        config: Any = None,
        request_timeout_s: float = 10.0,
        poll_s: float = 20.0,
    ) -> None:
        if config is None or not getattr(config, "url", None):
            raise InvalidRequest("the remote runtime needs its config: RemoteRuntime(url=...)")
        self.session_id = session_id
        self.config = config
        self.url = str(config.url).rstrip("/")
        self.env = dict(env or {})
        self.secret_names = tuple(self.env) if secret_names is None else tuple(secret_names)
        self.max_output_chars = max_output_chars
        self.request_timeout_s = request_timeout_s
        self.poll_s = poll_s
        """Longest single long-poll (the server caps it at 30 s)."""
        self.remote_workspace: str | None = None
        """The workspace's path on the server's machine, once started."""
        token = config.token.get_secret_value() if config.token is not None else (
            os.environ.get(config.token_env) if config.token_env else None)
        self._token = token or None
        if self._token:
            remember_secrets({TOKEN_NAME: self._token})  # masked in this process's logs
        self._http: Any = None
        self._http_lock = threading.Lock()
        self._epoch: int | None = None
        self._asked: int | str | None = _NEVER
        """What the last ``start`` asked to claim (``_NEVER`` before one)."""
        self._boot_id: str | None = None
        self._cancelled = threading.Event()
        """Set by ``cancel``: no wait for the server goes on (the owner is closing)."""

    # ---- Sandbox ----

    @property
    def epoch(self) -> int | None:
        """The epoch claimed by the last ``start``; None before one."""
        return self._epoch

    @property
    def runtime(self) -> RemoteSandbox:
        """The action runtime of the started sandbox (this object)."""
        if self._epoch is None:
            raise RemoteUnavailable(f"session {self.session_id}: the sandbox is not started",
                                    RuntimeFailure.NOT_STARTED)
        return self

    def start(self, epoch: int | None = None) -> bool:
        """Wait for the server, then start the session's sandbox there or attach to it,
        claiming ``epoch`` (None: the next the server counts). True when attached."""
        self._epoch = None
        self._asked = epoch  # a refused claim must not leave this object stopping others
        self._wait_ready()
        body = {"epoch": "next" if epoch is None else epoch, "env": self.env,
                "secret_names": list(self.secret_names),
                "max_output_chars": self.max_output_chars}
        answer = self._call("POST", self._path("start"), body, operation="start",
                            retry=True)
        self._epoch, self._boot_id = int(answer["epoch"]), answer.get("boot_id")
        self.remote_workspace = answer.get("workspace")
        attached = bool(answer.get("attached"))
        logger.info("session %s: remote sandbox %s at %s (epoch %d, workspace %s on the "
                    "server)", self.session_id, "attached" if attached else "started",
                    self.url, self._epoch, self.remote_workspace)
        return attached

    def cancel(self) -> None:
        """The owner is closing (called from another thread): a ``start`` waiting for the
        server to answer, and any retry's wait, ends now with ``RemoteUnavailable``; a
        request already sent still gets its answer. For good: nothing waits after it."""
        self._cancelled.set()

    def _pause(self, seconds: float, operation: str) -> None:
        """Wait ``seconds`` before trying again, unless the start was cancelled."""
        if self._cancelled.wait(seconds):
            raise RemoteUnavailable(f"{operation}: session {self.session_id}: cancelled "
                                    "(the sandbox is closing)", RuntimeFailure.FAILED)

    def alive(self) -> SandboxHealth:
        """Whether the session's sandbox still runs on the server, for this epoch."""
        if self._epoch is None:
            return SandboxHealth(alive=False, cause=RuntimeFailure.NOT_STARTED,
                                 detail="start() was not called")
        try:
            answer = self._call("GET", self._path("health"), operation="health",
                                timeout_s=5.0)
        except RuntimeUnavailable as e:
            return SandboxHealth(alive=False, cause=cause_of(e), detail=str(e))
        if int(answer.get("epoch") or 0) > self._epoch:
            return SandboxHealth(alive=False, cause=RuntimeFailure.SUPERSEDED, detail=(
                f"claimed by epoch {answer['epoch']} (this proxy has {self._epoch})"))
        if not answer.get("running"):
            return SandboxHealth(alive=False, cause=RuntimeFailure.EXITED, detail=(
                f"no sandbox runs for session {self.session_id} on {self.url} any more "
                "(crashed, stopped, or the server restarted)"))
        if answer.get("boot_id") != self._boot_id:
            return SandboxHealth(alive=False, cause=RuntimeFailure.EXITED, detail=(
                f"the sandbox on {self.url} was restarted (boot {answer.get('boot_id')})"))
        return SandboxHealth(alive=True)

    def stop(self) -> None:
        """Stop the session's sandbox on the server (its journal stays there). A sandbox a
        newer epoch claimed is left alone. Idempotent and bounded in time."""
        epoch = self._epoch if self._epoch is not None else self._asked
        if epoch is None:  # a start that claimed nothing: no sandbox of ours to stop
            self.close()
            return
        try:
            body = {} if epoch == _NEVER else {"epoch": epoch}  # never started: any
            self._call("POST", self._path("stop"), body, operation="stop", timeout_s=5.0)
        except StaleEpoch:
            logger.warning("session %s: the remote sandbox belongs to a newer epoch; left "
                           "running", self.session_id)
        except RuntimeUnavailable as e:
            logger.info("session %s: the remote sandbox did not take a stop: %s",
                        self.session_id, e)
        finally:
            self._epoch = None
            self.close()

    def running(self) -> bool:
        """Whether the server runs this session's sandbox (False when it does not answer)."""
        try:
            return bool(self._call("GET", self._path("health"), operation="health",
                                   timeout_s=5.0).get("running"))
        except RuntimeUnavailable:
            return False

    def kill(self) -> int | None:
        """Fault injection: have the server SIGKILL this session's shell and its jobs and
        drop the sandbox as a crash would. The shell's pid, or None if none ran."""
        try:
            killed = self._call("POST", self._path("crash"), {}, operation="crash",
                                timeout_s=10.0).get("killed")
        except RuntimeUnavailable:
            return None
        return int(killed) if killed else None

    def close(self) -> None:
        """Close the HTTP connections (idempotent)."""
        http, self._http = self._http, None
        if http is not None:
            http.close()

    # ---- files and output (beyond the protocol) ----

    def output(self, action_id: str, offset: int = 0) -> tuple[str, int]:
        """An action's output from byte ``offset`` (masked); and the next offset."""
        answer = self._call("GET", self._path("actions", action_id, "output"),
                            params={"offset": offset, "epoch": self._epoch},
                            operation=f"output {action_id}", retry=True)
        return str(answer.get("data", "")), int(answer.get("next_offset", offset))

    def upload(self, path: str, data: bytes) -> int:
        """Write ``data`` to ``path`` in the remote workspace; the size written."""
        answer = self._call("PUT", self._path("files"), content=data,
                            params={"path": path, "epoch": self._epoch},
                            operation=f"upload {path}", timeout_s=120.0)
        return int(answer["size"])

    def restore(self, from_session: str, checkpoint: str) -> dict[str, str]:
        """Before this session's sandbox starts: its workspace on the server becomes
        checkpoint ``checkpoint`` of ``from_session`` there (a fork); what it left out."""
        answer = self._call("POST", self._path("restore"),
                            {"from_session": from_session, "checkpoint": checkpoint},
                            operation=f"restore {checkpoint} of {from_session}",
                            timeout_s=300.0)
        return dict(answer.get("skipped") or {})

    def download(self, path: str) -> bytes:
        """The bytes of ``path`` in the remote workspace."""
        return self._call("GET", self._path("files"), params={"path": path, "epoch": self._epoch},
                          operation=f"download {path}", timeout_s=120.0, raw=True)

    # ---- HTTP ----

    def _path(self, *parts: str) -> str:
        return "/v1/sessions/" + "/".join(quote(p, safe="") for p in (self.session_id, *parts))

    @property
    def where(self) -> str:
        return f"the runtime server at {self.url}"

    def _send_action(self, body: dict[str, Any], *, timeout_s: float,
                     operation: str) -> dict[str, Any]:
        return self._call("POST", self._path("actions"), body, operation=operation,
                          timeout_s=timeout_s, retry=True)

    def _fetch_record(self, action_id: str, wait_s: float, *, timeout_s: float,
                      operation: str) -> dict[str, Any]:
        params = {"wait_s": f"{wait_s:.3f}", "epoch": self._epoch}
        return self._call("GET", self._path("actions", action_id), params=params,
                          operation=operation, timeout_s=timeout_s, retry=True)

    def _wait_ready(self) -> None:
        """Poll ``/v1/health`` until it answers, for up to ``ready_timeout_s``; a refused
        token or a server that is not a runtime server raises ``RuntimeMisconfigured`` at
        once."""
        limit_s = float(self.config.ready_timeout_s)
        deadline, pause_s, said = time.monotonic() + limit_s, 0.05, False
        while True:
            try:
                answer = self._call("GET", "/v1/health", operation="health", timeout_s=5.0)
                checked_health(self.url, answer)
                return
            except RemoteUnavailable as e:
                misconfigured = refused_at_start(self.url, self.config.token_env,
                                                 bool(self._token), e)
                if misconfigured is not None:  # no wait and no restart can mend it
                    raise misconfigured from e
                if time.monotonic() >= deadline:
                    raise RemoteUnavailable(
                        f"session {self.session_id}: the runtime server at {self.url} did not "
                        f"answer healthy within {limit_s:g} s: {e}", e.cause) from e
                if not said:
                    logger.info("session %s: waiting up to %g s for the runtime server at %s "
                                "to answer healthy (%s)", self.session_id, limit_s, self.url, e)
                    said = True
            self._pause(min(pause_s, max(0.0, deadline - time.monotonic())), "start")
            pause_s = min(1.0, pause_s * 2)

    def _client(self) -> Any:
        with self._http_lock:  # the proxy calls from several threads at once
            if self._http is None:
                import httpx

                from ..llm import http_pool

                http_pool.install()  # its threads share the pool (encode/httpcore#1110)
                verify: Any = self.config.verify
                if isinstance(verify, str):
                    verify = ssl.create_default_context(cafile=verify)
                elif verify is True:
                    verify = default_ssl_context()
                # trust_env=False: no proxy from the environment ever sees the token
                # TCP_NODELAY: headers and body leave in two writes, and delayed ACKs
                # would add 40 ms to every request
                transport = httpx.HTTPTransport(verify=verify, socket_options=[
                    (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
                self._http = httpx.Client(base_url=self.url, transport=transport,
                                          trust_env=False,
                                          headers={"Authorization": f"Bearer {self._token}"})
            return self._http

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
              operation: str, params: dict[str, Any] | None = None,
              content: bytes | None = None, timeout_s: float | None = None,
              retry: bool = False, raw: bool = False) -> Any:
        import httpx

        if not self._token:
            raise RemoteUnavailable(
                f"{operation}: no token for the runtime server at {self.url}: give the "
                f"runtime's token, or set ${self.config.token_env}",
                RuntimeFailure.UNAUTHORIZED)
        params = {k: v for k, v in (params or {}).items() if v is not None}
        timeout = httpx.Timeout(timeout_s or self.request_timeout_s, connect=5.0)
        waits = list(RETRIES) if retry else []
        while True:
            try:
                response = self._client().request(
                    method, path, json=body, params=params, content=content, timeout=timeout)
            except httpx.HTTPError as e:
                if waits:
                    self._pause(waits.pop(0), operation)
                    continue
                raise unreachable(self.where, operation, e) from e
            if response.status_code in _RETRY_STATUS and waits:
                self._pause(waits.pop(0), operation)
                continue
            if response.status_code == 200 and raw:
                return response.content
            return answer_json(self.where, operation, response.status_code, response.content)
