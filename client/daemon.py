"""The daemon's HTTP client: ``Trouper.connect()``, the session API over HTTP.

``RemoteTrouper`` and ``RemoteSession`` implement ``client_protocol``'s ``TrouperClient``
and ``SessionHandle`` as the embedded ``Trouper`` and ``Session`` do, with the same
return types: ``sessions()`` gives ``SessionSummary`` rows and ``info()`` a
``SessionInfo``, parsed from the daemon's JSON (``session_info``).

    t = Trouper.connect()                          # the local daemon of ~/.trouper
    s = t.start_session("make hello.txt", llm={"model": "openai/gpt-4o"})
    for event in s.events(follow=True):            # SSE, reconnecting from the last seq
        print(event.seq, event.kind)
    assert s.wait(timeout=600) == AgentState.FINISHED

Errors come back as trouper's exceptions: 404 UnknownSession, 422 ConfigError (``field``
set), 409 InvalidRequest, 503 RequestTimeout; 401/403 and an unreachable daemon raise
``DaemonUnavailable``. A stream that ends early (the client was too slow, the daemon
restarted, the connection dropped) is resumed from the last seq received, so
``events(follow=True)`` yields every event once, in order; setting its ``stop`` ends it
within 0.1 s, however quiet the stream. A read, a create or a
command whose connection fails (or that is answered 503, the daemon unavailable for a
moment) is made again for up to ``retry_s``, and a create or a command is carried out
once: a create names its session, a command goes under one ``Idempotency-Key`` for all
its attempts.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel, SecretStr

from ..core.fold import SessionView
from ..daemon.files import DaemonFiles, read_token, running_info
from ..exceptions import (
    TrouperError,
)
from ..home.paths import Home
from ..messages.events import EVENT_ADAPTER, ActionEvent, AgentState, Event
from ..security.tls import default_ssl_context
from .http_answers import DaemonUnavailable, error_of, retry_after
from .info import SessionInfo, SessionSummary, state_filter
from .session import new_session_id
from .sse_reading import cut_when_set, parse_sse

if TYPE_CHECKING:
    from ..config.models import LLMConfig, RuntimeConfig
    from ..workspace_diff import WorkspaceDiff

RECONNECT_WAIT_S = 0.5
RETRY_S = 15.0
"""How long a read, a create or a command is made again while the connection fails (a
daemon restarting opens its ``Trouper`` again in a few seconds)."""
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 1.0
FAULT_POLL_S = 0.5
"""How often ``wait`` asks again while a storage fault lasts (no event comes to wake it)."""


def connect(url: str | None = None, *, token: str | None = None,
            home: str | os.PathLike[str] | None = None, timeout_s: float = 60.0
            ) -> RemoteTrouper:
    """A client of the daemon at ``url`` (default: the one running for ``home``), with
    ``token`` (default: the home's)."""
    files = DaemonFiles(Home.at(home))
    if url is None:
        info = running_info(files)
        if info is None:
            raise DaemonUnavailable(f"no daemon runs for {files.home.root}: start one with "
                                    "'trouper daemon start'")
        url = str(info["url"])
    token = token if token is not None else read_token(files)
    if not token:
        raise DaemonUnavailable(f"no token: give token= or start the daemon of "
                                f"{files.home.root} once (it makes {files.token})")
    return RemoteTrouper(url, token, timeout_s=timeout_s)


class RemoteTrouper:
    """The ``Trouper`` session API, served by a daemon (a ``TrouperClient``)."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 60.0,
                 retry_s: float = RETRY_S) -> None:
        self.url = url.rstrip("/")
        self.retry_s = retry_s
        """How long a read, a create or a command is made again while the connection
        fails."""
        self._headers = {"Authorization": f"Bearer {token}"}
        # trust_env=False: no proxy from the environment ever sees the token
        self._http = httpx.Client(base_url=self.url, headers=self._headers,
                                  timeout=httpx.Timeout(timeout_s, connect=5.0),
                                  verify=default_ssl_context(), trust_env=False)

    def __enter__(self) -> RemoteTrouper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections; the daemon's sessions go on. Idempotent."""
        self._http.close()

    def request(self, method: str, path: str, *, retry_s: float | None = None,
                **kwargs: Any) -> Any:
        """One call to the API; its JSON, or the error as trouper's exception. A call the
        connection failed (refused, reset, timed out: a daemon restarting) is made again
        until ``retry_s`` has passed: by default a read (GET) for ``self.retry_s`` and a
        write not at all; a write passes ``retry_s`` only when it is safe to repeat (a
        create that names its session, a command under an idempotency key)."""
        if retry_s is None:
            retry_s = self.retry_s if method == "GET" else 0.0
        deadline = time.monotonic() + retry_s
        wait = RETRY_FIRST_S
        while True:
            try:
                answer = self._http.request(method, path, **kwargs)
                if answer.status_code != 503 or time.monotonic() + wait > deadline:
                    break
                # unavailable for a moment (a store outage, a daemon rejoining its cluster)
                time.sleep(min(retry_after(answer), RETRY_MAX_S))
                wait = min(RETRY_MAX_S, wait * 2)
            except httpx.TransportError as exc:
                if time.monotonic() + wait > deadline:
                    raise DaemonUnavailable(f"the daemon at {self.url} does not answer: "
                                            f"{type(exc).__name__}: {exc}") from None
                time.sleep(wait)  # backoff between attempts
                wait = min(RETRY_MAX_S, wait * 2)
            except httpx.HTTPError as exc:
                raise DaemonUnavailable(f"the daemon at {self.url} does not answer: "
                                        f"{type(exc).__name__}: {exc}") from None
        if answer.status_code >= 400:
            raise error_of(answer)
        return answer.json()


    def health(self) -> dict[str, Any]:
        return self.request("GET", "/v1/health")  # type: ignore[no-any-return]

    def start_session(self, task: str, *, llm: Mapping[str, Any] | LLMConfig,
                      runtime: str | Mapping[str, Any] | RuntimeConfig = "local",
                      workspace: str | os.PathLike[str] | None = None,
                      secrets: Mapping[str, str] | None = None,
                      session_id: str | None = None, **options: Any) -> RemoteSession:
        """As ``Trouper.start_session``; ``session_id`` makes it idempotent (the same id
        and arguments return the same session)."""
        body: dict[str, Any] = {"task": task, "llm": _plain(llm), "runtime": _plain(runtime),
                                "secrets": dict(secrets or {}), **_plain(options)}
        if workspace is not None:  # the daemon runs elsewhere: a path from here, whole
            body["workspace"] = os.path.abspath(os.path.expanduser(os.fspath(workspace)))
        # an id chosen here makes the create idempotent, so it is safe to send again
        body["id"] = session_id if session_id is not None else new_session_id()
        made = self.request("POST", "/v1/sessions", json=body, retry_s=self.retry_s)
        return RemoteSession(self, made["id"])

    def fork(self, session_id: str, at_seq: int | None = None, message: str | None = None,
             *, llm: Mapping[str, Any] | LLMConfig | None = None,
             workspace: str | os.PathLike[str] | None = None) -> RemoteSession:
        """As ``Trouper.fork``, by the daemon (``POST .../fork``)."""
        return self._fork("fork", session_id, at_seq, message, llm, workspace)

    def rewind(self, session_id: str, at_seq: int | None = None, message: str | None = None,
               *, llm: Mapping[str, Any] | LLMConfig | None = None,
               workspace: str | os.PathLike[str] | None = None) -> RemoteSession:
        """As ``Trouper.rewind``, by the daemon (``POST .../rewind``)."""
        return self._fork("rewind", session_id, at_seq, message, llm, workspace)

    def _fork(self, route: str, session_id: str, at_seq: int | None, message: str | None,
              llm: Mapping[str, Any] | LLMConfig | None,
              workspace: str | os.PathLike[str] | None) -> RemoteSession:
        body: dict[str, Any] = {"at_seq": at_seq, "message": message}
        if llm is not None:
            body["llm"] = _plain(llm)
        if workspace is not None:  # the daemon runs elsewhere: a path from here, whole
            body["workspace"] = os.path.abspath(os.path.expanduser(os.fspath(workspace)))
        made = self.request("POST", f"/v1/sessions/{session_id}/{route}", json=body)
        return RemoteSession(self, made["id"])

    def sessions(self, state: AgentState | str | None = None, *,
                 replaced: bool = False) -> list[SessionSummary]:
        """Every session (newest first), read page by page; with ``state``, only those in
        it (ConfigError for a name that is no state); replaced ones only with
        ``replaced``."""
        out: list[SessionSummary] = []
        params: dict[str, Any] = {"limit": 500}
        wanted = state_filter(state)
        if wanted is not None:
            params["state"] = wanted.value
        if replaced:
            params["replaced"] = "true"
        while True:
            page = self.request("GET", "/v1/sessions", params=params)
            out += [SessionSummary.model_validate(row) for row in page["sessions"]]
            if not page.get("next_cursor"):
                return out
            params["cursor"] = page["next_cursor"]

    def session(self, session_id: str) -> RemoteSession:
        """The session with that id. Raises UnknownSession."""
        self.request("GET", f"/v1/sessions/{session_id}")
        return RemoteSession(self, session_id)

    def stream(self, session_id: str, after: int, *, until_settled: bool,
               stop: threading.Event | None = None, deadline: float | None = None
               ) -> Iterator[Event]:
        """Events with seq > ``after`` from the SSE stream, reconnecting from the last one
        received when the stream ends early; ends when the session is settled (with
        ``until_settled``), ``stop`` is set or ``deadline`` (monotonic) passes."""
        while not (stop is not None and stop.is_set()):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            reason = None
            try:
                for kind, data in self._sse(session_id, after, until_settled, left, stop):
                    if kind == "end":
                        reason = data.get("reason")
                        break
                    if kind == "message":
                        event = EVENT_ADAPTER.validate_python(data)
                        after = event.seq
                        yield event
                    if (stop is not None and stop.is_set()) or (
                            deadline is not None and time.monotonic() >= deadline):
                        return
            except (httpx.TimeoutException, httpx.RemoteProtocolError, httpx.ReadError):
                reason = "dropped"
            except httpx.ConnectError:
                reason = "unreachable"
            if reason == "settled":
                return
            if reason == "error":
                raise TrouperError(f"the stream of session {session_id} failed")
            if reason in ("closing", "unreachable") and stop is not None:
                stop.wait(RECONNECT_WAIT_S)  # a poll interval while the daemon restarts
            elif reason in ("closing", "unreachable"):
                time.sleep(RECONNECT_WAIT_S)

    def _sse(self, session_id: str, after: int, until_settled: bool, left_s: float | None,
             stop: threading.Event | None) -> Iterator[tuple[str, dict[str, Any]]]:
        params = {"until_settled": "true" if until_settled else "false"}
        headers = {"Last-Event-ID": str(after), "Accept": "text/event-stream"}
        timeout = httpx.Timeout(connect=5.0, read=max(0.5, min(left_s or 30.0, 30.0)),
                                write=5.0, pool=5.0)
        with self._http.stream("GET", f"/v1/sessions/{session_id}/events/stream",
                               params=params, headers=headers, timeout=timeout) as answer:
            if answer.status_code >= 400:
                answer.read()
                raise error_of(answer)
            with cut_when_set(stop, answer):
                yield from parse_sse(answer.iter_lines())


class RemoteSession:
    """``Session`` over HTTP (a ``SessionHandle``): the same members, read from the
    daemon."""

    def __init__(self, trouper: RemoteTrouper, session_id: str) -> None:
        self._trouper = trouper
        self.id = session_id

    def __repr__(self) -> str:
        return f"RemoteSession({self.id!r})"

    def info(self) -> SessionInfo:
        """The session at a glance: its summary, state, fault, cost, steps, config."""
        return SessionInfo.model_validate(self._detail())

    def _detail(self) -> dict[str, Any]:
        return self._trouper.request("GET", f"/v1/sessions/{self.id}")  # type: ignore[no-any-return]

    @property
    def state(self) -> AgentState:
        """The state in the log; ERROR while a storage fault keeps it from recording."""
        return self.info().state

    @property
    def fault(self) -> str | None:
        """Why the session cannot record anything right now, or None."""
        return self.info().fault

    @property
    def workspace(self) -> str:
        """The absolute path of the folder the agent works in."""
        return self.info().workspace

    def view(self) -> SessionView:
        """The session folded from its whole log (state, cost, pending actions...)."""
        return SessionView.of(self.events())

    def diff(self) -> WorkspaceDiff:
        """What changed in the workspace since the session started (the daemon compares
        it: ``GET /v1/sessions/{id}/diff``)."""
        from ..workspace_diff import WorkspaceDiff

        return WorkspaceDiff.model_validate(
            self._trouper.request("GET", f"/v1/sessions/{self.id}/diff"))

    @property
    def awaiting_confirmation(self) -> ActionEvent | None:
        """The action waiting for the user's approval, or None."""
        return self.info().awaiting_confirmation

    def _command(self, name: str, body: dict[str, Any] | None = None) -> int:
        # one key for every attempt: the command is carried out once however often sent
        answer = self._trouper.request(
            "POST", f"/v1/sessions/{self.id}/{name}", json=body,
            headers={"Idempotency-Key": uuid.uuid4().hex}, retry_s=self._trouper.retry_s)
        return int(answer["seq"])

    def send(self, text: str) -> int:
        """Give the agent a message; a finished or waiting session runs again."""
        return self._command("messages", {"text": text})

    def pause(self) -> int:
        """Pause the session: it waits, its sandbox kept, until ``resume``."""
        return self._command("pause")

    def resume(self) -> int:
        """Carry a paused, stopped, rate-limited or failed session on."""
        return self._command("resume")

    def stop(self) -> int:
        """Stop the session and end its sandbox; ``resume`` goes on in a fresh one."""
        return self._command("stop")

    def approve(self, action_id: str = "") -> int:
        """Run the action waiting for approval (with ``action_id``: only that one)."""
        return self._command("approve", {"action_id": action_id})

    def reject(self, reason: str = "", action_id: str = "") -> int:
        """Do not run the action waiting for approval: recorded ``rejected``."""
        return self._command("reject", {"action_id": action_id, "reason": reason})

    def budget(self, max_cost_usd: float | None = None,
               max_iterations: int | None = None) -> int:
        """Set the session's budget from now on (``POST .../budget``)."""
        return self._command("budget", {"max_cost_usd": max_cost_usd,
                                        "max_iterations": max_iterations})

    def events(self, since: int = 0, *, follow: bool = False, until_settled: bool = True,
               timeout_s: float | None = None, stop: threading.Event | None = None
               ) -> Iterator[Event]:
        """As ``Session.events``: with ``follow``, the live stream (SSE)."""
        self._detail()  # an unknown id raises here, not at the first event
        if follow:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            return self._trouper.stream(self.id, since, until_settled=until_settled,
                                        stop=stop, deadline=deadline)
        return self._pages(since)

    def _pages(self, since: int) -> Iterator[Event]:
        while True:
            page = self._trouper.request("GET", f"/v1/sessions/{self.id}/events",
                                         params={"after": since, "limit": 5000})
            for data in page["events"]:
                yield EVENT_ADAPTER.validate_python(data)
            if page["next_after"] >= page["head_seq"] or not page["events"]:
                return
            since = page["next_after"]

    def wait(self, timeout: float | None = None) -> AgentState:
        """Block until the session is settled (or ``timeout`` passes); return its state."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            info = self.info()
            if info.settled:
                return info.state
            if deadline is not None and time.monotonic() >= deadline:
                return info.state
            for _ in self._trouper.stream(self.id, info.last_seq, until_settled=True,
                                          deadline=deadline):
                pass
            if info.fault:
                time.sleep(FAULT_POLL_S)  # a storage fault: no event will wake us; ask again


def _plain(value: Any) -> Any:
    """A value as the JSON the API takes: a config model (``LLMConfig``, a runtime, a
    ``ConfirmationPolicy``) as its fields, its secrets in clear (the daemon keeps them
    as the embedded ``Trouper`` does), a path as its text."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="python", exclude_none=True)
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value
