"""An OpenAI-compatible LLM server on loopback that plays a ``Script``.

Tests, the demo and the benchmarks point litellm at it, so every call takes litellm's
real HTTP path. Stepping is stateless: step ``k`` answers a conversation whose
``messages`` already hold ``k`` assistant messages (or whose ``X-Trouper-Turn`` header,
sent by trouper's broker, says ``k``: a condensed prompt holds fewer), so concurrent
sessions and restarted sessions are all served right. Failures (``fail`` in a step) are counted
per conversation (the ``X-Trouper-Session`` header, else a hash of the first user
message) and step.

Example:
    >>> import litellm
    >>> with FakeLLMServer([{"say": "hello"}]) as server:
    ...     r = litellm.completion(
    ...         model="hosted_vllm/fake", api_base=server.url, api_key="x",
    ...         messages=[{"role": "user", "content": "hi"}])
    >>> r.choices[0].message.content
    'hello'
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from .script import Failure, Script, ScriptSource, ToolCallSpec, load_script

logger = logging.getLogger(__name__)

SESSION_HEADER = "x-trouper-session"
TURN_HEADER = "x-trouper-turn"
"""Request header whose value keys the fail counters, when present."""
CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
MODEL_PATHS = frozenset({"/v1/models", "/models"})
RPM_WINDOW_S = 60.0
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received, and what it answered."""

    time_s: float
    """Arrival time (``time.time()``)."""
    method: str
    path: str
    body: dict[str, Any] | None
    """The parsed JSON body; ``None`` for a GET or a body that did not parse."""
    headers: dict[str, str]
    """Request headers, names lower-cased."""
    conversation: str | None
    """The key fail counters use; ``None`` when no step was looked up."""
    step: int | None
    """The step index this request asked for; ``None`` when no step was looked up."""
    status: int
    """The HTTP status served."""


@dataclass(frozen=True)
class _Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


class _BadRequest(Exception):
    pass


class FakeLLMServer:
    """A scripted ``chat.completions`` server on a loopback port.

    Args:
        script: a ``Script``, a list of steps, or a path to a JSON script.
        host: interface to bind (loopback by default).
        port: port to bind; 0 picks a free one (read it back from ``.port``).
        latency_s: delay added to every answer.
        rpm: when set, the server answers 429 with ``Retry-After`` once ``rpm``
            requests were admitted in the last 60 s (rejected ones do not count).
    """

    def __init__(
        self,
        script: ScriptSource,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        rpm: int | None = None,
    ) -> None:
        self.script: Script = load_script(script)
        self.host = host
        self.port = port
        self.latency_s = latency_s
        self.rpm = rpm
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._attempts: dict[tuple[str, int], int] = {}
        self._admitted: deque[float] = deque()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----

    def start(self) -> FakeLLMServer:
        """Bind and serve in a background thread; a no-op while already serving.

        After ``stop()`` it starts again on the same port, keeping its counters.
        """
        if self._server is not None:
            return self
        server = _Server((self.host, self.port), self)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name=f"fake-llm-{self.port}",
        )
        self._thread.start()
        logger.debug("fake LLM serving at %s", self.url)
        return self

    def stop(self) -> None:
        """Stop serving and close every open connection; a no-op when stopped."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        server.stopped.set()
        server.shutdown()
        server.close_connections()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5.0)

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- what tests read ----

    @property
    def url(self) -> str:
        """The API base to give litellm, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def llm(self, model: str = "hosted_vllm/scripted", **options: Any) -> dict[str, Any]:
        """An LLM config for ``start_session(llm=...)`` that talks to this server."""
        return {"model": model, "base_url": self.url, "api_key": "scripted", **options}

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def reset(self) -> None:
        """Forget received requests, fail counters and the rpm window."""
        with self._lock:
            self._requests.clear()
            self._attempts.clear()
            self._admitted.clear()

    # ---- answering (called from the handler threads) ----

    def answer_post(self, path: str, headers: dict[str, str], raw: bytes) -> _Reply:
        """Answer one POST: a completion, a scripted error, a 429 or a 400."""
        now = time.time()
        body: dict[str, Any] | None = None
        key: str | None = None
        step: int | None = None
        if path not in CHAT_PATHS:
            reply = _error(404, f"no route for POST {path}; use /v1/chat/completions")
        else:
            try:
                body = _parse_body(raw)
            except _BadRequest as e:
                reply = _error(400, str(e))
            else:
                key = headers.get(SESSION_HEADER) or _conversation_key(body["messages"])
                step = _step_of(headers, body["messages"])
                reply = self._admit(now) or self._play(key, step, body, len(raw))
        self._record(RecordedRequest(now, "POST", path, body, headers, key, step, reply.status))
        return reply

    def answer_get(self, path: str, headers: dict[str, str]) -> _Reply:
        """Answer a GET: the model list, or a health check."""
        if path in MODEL_PATHS:
            model = {"id": "fake", "object": "model", "created": 0, "owned_by": "trouper"}
            reply = _Reply(200, {"object": "list", "data": [model]})
        elif path == "/health":
            reply = _Reply(200, {"status": "ok"})
        else:
            reply = _error(404, f"no route for GET {path}")
        now = time.time()
        self._record(RecordedRequest(now, "GET", path, None, headers, None, None, reply.status))
        return reply

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _admit(self, now: float) -> _Reply | None:
        """``None`` when the request may proceed, else the server's own 429."""
        if self.rpm is None:
            return None
        with self._lock:
            while self._admitted and self._admitted[0] <= now - RPM_WINDOW_S:
                self._admitted.popleft()
            if len(self._admitted) < self.rpm:
                self._admitted.append(now)
                return None
            wait_s = max(1, int(self._admitted[0] + RPM_WINDOW_S - now + 0.999))
        msg = f"Rate limit reached: {self.rpm} requests per minute; retry after {wait_s} s"
        return _error(429, msg, {"Retry-After": str(wait_s)})

    def _play(self, key: str, k: int, body: dict[str, Any], request_chars: int) -> _Reply:
        model = str(body.get("model") or "fake")
        if k >= len(self.script.steps):
            text = f"The script has no step {k}: it has {len(self.script.steps)} steps."
            return _Reply(200, _completion(model, text, (), request_chars, k), {}, 0.0)
        step = self.script.steps[k]
        with self._lock:
            attempt = self._attempts.get((key, k), 0)
            self._attempts[(key, k)] = attempt + 1
        if attempt < len(step.fail):
            return _failure(step.fail[attempt], k, attempt)
        completion = _completion(model, step.say, step.calls, request_chars, k)
        return _Reply(200, completion, {}, step.delay_s)


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _BadRequest(f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty list of message objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _BadRequest(f"messages[{i}] must be an object with a string 'role'")
    if body.get("stream"):
        raise _BadRequest("'stream': true is not supported by the fake LLM server")
    return body


def _step_of(headers: dict[str, str], messages: list[dict[str, Any]]) -> int:
    """The ``X-Trouper-Turn`` header (the turns of the whole session, which a condensed
    prompt no longer shows), else the assistant messages in the request."""
    turn = headers.get(TURN_HEADER, "")
    if turn.isdigit():
        return int(turn)
    return sum(1 for m in messages if m.get("role") == "assistant")


def _conversation_key(messages: list[dict[str, Any]]) -> str:
    first = next((m for m in messages if m.get("role") == "user"), messages[0])
    text = json.dumps(first.get("content"), sort_keys=True)
    return "user:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _completion(
    model: str, text: str | None, calls: tuple[ToolCallSpec, ...], request_chars: int, k: int
) -> dict[str, Any]:
    """A real ``chat.completion`` object with the given content and tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    response_chars = len(text or "")
    if calls:
        tag = uuid.uuid4().hex[:12]
        message["tool_calls"] = [
            {
                "id": f"call_{tag}_{k}_{i}",
                "type": "function",
                "function": {"name": c.tool, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ]
        response_chars += sum(len(c.tool) + len(c.arguments) for c in calls)
    prompt_tokens = max(1, request_chars // 4)
    completion_tokens = max(1, response_chars // 4)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _failure(failure: Failure, k: int, attempt: int) -> _Reply:
    headers = dict(failure.headers)
    if failure.retry_after is not None:
        value = failure.retry_after
        headers["Retry-After"] = str(int(value)) if value == int(value) else str(value)
    if failure.retry_after_ms is not None:
        headers["retry-after-ms"] = str(failure.retry_after_ms)
    msg = failure.message or f"scripted error {failure.status} for step {k} (attempt {attempt})"
    return _error(failure.status, msg, headers)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> _Reply:
    """An OpenAI-style error response."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "api_error")
    body = {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}
    return _Reply(status, body, headers or {})


class _Server(ThreadingHTTPServer):
    """A threading HTTP server that can close its open keep-alive connections."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], fake: FakeLLMServer) -> None:
        self.fake = fake
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        self.stopped = threading.Event()
        """Set by ``stop()``: delayed answers are dropped instead of sent."""
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is normal here; anything else is logged."""
        logger.debug("fake LLM connection from %s ended badly", client_address, exc_info=True)

    def close_connections(self) -> None:
        """Shut down every connection still open, so idle keep-alives end now."""
        with self._open_lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 60.0
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        length = self.headers.get("Content-Length", "")
        raw = self.rfile.read(int(length)) if length.isdigit() else b""
        self._answer(lambda path, hdrs: self.server.fake.answer_post(path, hdrs, raw))

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self._answer(self.server.fake.answer_get)

    def _answer(self, answer: Any) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            reply = answer(path, headers)
        except Exception as e:  # a bug here must not kill the connection silently
            logger.exception("fake LLM failed to answer %s", path)
            reply = _error(500, f"fake LLM server error: {type(e).__name__}: {e}")
        delay_s = self.server.fake.latency_s + reply.delay_s
        if delay_s > 0 and self.server.stopped.wait(delay_s):
            self.close_connection = True  # stopped while waiting: no answer
            return
        self._send(reply)

    def _send(self, reply: _Reply) -> None:
        data = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        logger.debug("fake LLM: " + format, *args)


def serve(script_path: str, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve ``script_path`` in the foreground until SIGINT or SIGTERM; print the URL."""
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with FakeLLMServer(script_path, host=host, port=port) as server:
            steps = len(server.script.steps)
            print(f"fake LLM playing {script_path} ({steps} steps) at {server.url}", flush=True)
            print(f"use model 'hosted_vllm/fake' with api_base {server.url}", flush=True)
            while not stop.wait(0.5):
                pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
