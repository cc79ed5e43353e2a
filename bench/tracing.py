"""Workload ``tracing``: what OpenTelemetry traces cost a session's step.

K-step sessions (``echo i >> out.txt``, an instant scripted model) with
``OTEL_EXPORTER_OTLP_ENDPOINT`` unset (tracing off: nothing of OpenTelemetry is imported)
and set to a collector on loopback that accepts every export and discards it (tracing
on: a turn span, a model-call span and an action span a step, batched and sent). The
variable is read by the actor processes when they are forked, so each session runs in a
``Trouper`` of its own, opened after the variable is set; rounds alternate which goes
first. Reported: the median step (time between two model requests) of each, and the
difference. The first step of an "on" session holds the SDK's import in its three
processes; it is left out with the session's start, as every step is in
``checkpoints``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from common import chat_requests, echo_script, step_intervals_ms
from contenders import llm_config

from trouper import AgentState, Trouper
from trouper.testing import FakeLLMServer

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class _Discard(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.exports += 1  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def discarding_collector() -> Iterator[ThreadingHTTPServer]:
    """An OTLP/HTTP endpoint on 127.0.0.1 that answers 200 to every export (``exports``
    counts them)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discard)
    server.exports = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run(k: int, rounds: int, workdir: Path) -> dict[str, Any]:
    steps: dict[str, list[float]] = {"on": [], "off": []}
    saved = {name: os.environ.pop(name, None) for name in ENDPOINT_VARS}
    try:
        with discarding_collector() as collector:
            url = f"http://127.0.0.1:{collector.server_address[1]}"
            for round_no in range(rounds):
                order = ("on", "off") if round_no % 2 == 0 else ("off", "on")
                for which in order:
                    steps[which] += _one(k, url if which == "on" else None, workdir)
            exports = collector.exports  # type: ignore[attr-defined]
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
    on, off = statistics.median(steps["on"]), statistics.median(steps["off"])
    return {"k": k, "rounds": rounds, "median_step_ms_on": round(on, 3),
            "median_step_ms_off": round(off, 3), "cost_ms": round(on - off, 3),
            "exports_received": exports}


def _one(k: int, endpoint: str | None, workdir: Path) -> list[float]:
    """One K-step session in a Trouper of its own, traced to ``endpoint`` (None: off)."""
    tag = f"{'on' if endpoint else 'off'}-{time.monotonic_ns()}"
    if endpoint is not None:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    try:
        with FakeLLMServer(echo_script(k)) as server, \
                Trouper(home=workdir / f"tracing-home-{tag}") as t:
            session = t.start_session("echo", llm=llm_config(server),
                                      workspace=workdir / f"tracing-ws-{tag}",
                                      max_iterations=k + 5)
            state = session.wait(timeout=60 + k * 2.0)
            times = [r.time_s for r in chat_requests(server)]
    finally:
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if state != AgentState.FINISHED:
        raise RuntimeError(f"a session with tracing {tag} ended {state.value}")
    return step_intervals_ms(times)[1:k]  # the first interval holds the start (and import)
