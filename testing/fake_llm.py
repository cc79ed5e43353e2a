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

import json
import logging
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from ..host.processes import SignalRelay
from .fake_llm_wire import (
    SESSION_HEADER,
    TURN_HEADER,
    BadRequest,
    Reply,
    completion_body,
    conversation_key,
    error_reply,
    failure_reply,
    parse_body,
    step_of,
)
from .script import Script, ScriptSource, load_script

logger = logging.getLogger(__name__)

__all__ = ["FakeLLMServer", "RecordedRequest", "SESSION_HEADER", "TURN_HEADER", "serve"]

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
MODEL_PATHS = frozenset({"/v1/models", "/models"})
RPM_WINDOW_S = 60.0
"""The window the server's ``rpm`` counts over unless told otherwise, as providers do."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received, and what it answered."""

    time_s: float
    """Arrival time on the server's clock (``time.time()`` unless it was given one)."""
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


class FakeLLMServer:
    """A scripted ``chat.completions`` server on a loopback port.

    Args:
        script: a ``Script``, a list of steps, or a path to a JSON script.
        host: interface to bind (loopback by default).
        port: port to bind; 0 picks a free one (read it back from ``.port``).
        latency_s: delay added to every answer.
        rpm: when set, the server answers 429 with ``Retry-After`` once ``rpm``
            requests were admitted in the last ``rpm_window_s`` (rejected ones do not
            count).
        rpm_window_s: the sliding window ``rpm`` counts over; a test that compresses
            trouper's window (``TROUPER_RATE_WINDOW_S``) gives the server the same one.
        clock: seconds now, for arrival times and the rpm window (wall time by default;
            a test of the window alone passes a fake one and calls ``answer_post``).
        keep_bodies: record each request's parsed body (``RecordedRequest.body``); False
            records ``None`` instead, for runs of thousands of requests that read only
            their times and headers (a body with a long history holds tens of KB).
    """

    def __init__(
        self,
        script: ScriptSource,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        rpm: int | None = None,
        rpm_window_s: float = RPM_WINDOW_S,
        clock: Callable[[], float] = time.time,
        keep_bodies: bool = True,
    ) -> None:
        if not rpm_window_s > 0:
            raise ValueError(f"rpm_window_s must be positive, got {rpm_window_s!r}")
        self.script: Script = load_script(script)
        self.host = host
        self.port = port
        self.latency_s = latency_s
        self.rpm = rpm
        self.rpm_window_s = rpm_window_s
        self._clock = clock
        self.keep_bodies = keep_bodies
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

    def answer_post(self, path: str, headers: dict[str, str], raw: bytes) -> Reply:
        """Answer one POST: a completion, a scripted error, a 429 or a 400."""
        now = self._clock()
        body: dict[str, Any] | None = None
        key: str | None = None
        step: int | None = None
        if path not in CHAT_PATHS:
            reply = error_reply(404, f"no route for POST {path}; use /v1/chat/completions")
        else:
            try:
                body = parse_body(raw)
            except BadRequest as e:
                reply = error_reply(400, str(e))
            else:
                key = headers.get(SESSION_HEADER) or conversation_key(body["messages"])
                step = step_of(headers, body["messages"])
                reply = self._admit(now) or self._play(key, step, body, len(raw))
        kept = body if self.keep_bodies else None
        self._record(RecordedRequest(now, "POST", path, kept, headers, key, step, reply.status))
        return reply

    def answer_get(self, path: str, headers: dict[str, str]) -> Reply:
        """Answer a GET: the model list, or a health check."""
        if path in MODEL_PATHS:
            model = {"id": "fake", "object": "model", "created": 0, "owned_by": "trouper"}
            reply = Reply(200, {"object": "list", "data": [model]})
        elif path == "/health":
            reply = Reply(200, {"status": "ok"})
        else:
            reply = error_reply(404, f"no route for GET {path}")
        now = self._clock()
        self._record(RecordedRequest(now, "GET", path, None, headers, None, None, reply.status))
        return reply

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _admit(self, now: float) -> Reply | None:
        """``None`` when the request may proceed, else the server's own 429."""
        if self.rpm is None:
            return None
        with self._lock:
            while self._admitted and self._admitted[0] <= now - self.rpm_window_s:
                self._admitted.popleft()
            if len(self._admitted) < self.rpm:
                self._admitted.append(now)
                return None
            wait_s = max(1, int(self._admitted[0] + self.rpm_window_s - now + 0.999))
        msg = (f"Rate limit reached: {self.rpm} requests per {self.rpm_window_s:g} s; "
               f"retry after {wait_s} s")
        return error_reply(429, msg, {"Retry-After": str(wait_s)})

    def _play(self, key: str, k: int, body: dict[str, Any], request_chars: int) -> Reply:
        model = str(body.get("model") or "fake")
        if k >= len(self.script.steps):
            text = f"The script has no step {k}: it has {len(self.script.steps)} steps."
            return Reply(200, completion_body(model, text, (), request_chars, k), {}, 0.0)
        step = self.script.steps[k]
        with self._lock:
            attempt = self._attempts.get((key, k), 0)
            self._attempts[(key, k)] = attempt + 1
        if attempt < len(step.fail):
            return failure_reply(step.fail[attempt], k, attempt)
        completion = completion_body(model, step.say, step.calls, request_chars, k)
        return Reply(200, completion, {}, step.delay_s)


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
            reply = error_reply(500, f"fake LLM server error: {type(e).__name__}: {e}")
        delay_s = self.server.fake.latency_s + reply.delay_s
        if delay_s > 0 and self.server.stopped.wait(delay_s):
            self.close_connection = True  # stopped while waiting: no answer
            return
        self._send(reply)

    def _send(self, reply: Reply) -> None:
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
    relay = SignalRelay(stop.set)  # a handler that set it could deadlock (processes.py)

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        relay.fire()

    relay.__enter__()
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
        relay.__exit__()
