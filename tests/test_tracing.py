"""OpenTelemetry traces (``observability/tracing.py``): with an OTLP endpoint set, each
session turn is one trace whose root is the Controller's turn span and whose children,
from other processes, are the broker's model call and the RuntimeProxy's action; with
none set, no process imports OpenTelemetry at all."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from trouper import AgentState, Trouper
from trouper.testing import kill_actor, wait_until

pytestmark = pytest.mark.slow  # real sessions: actor processes, sandboxes


class Collector:
    """An OTLP/HTTP trace collector on loopback: POST ``/v1/traces`` (protobuf) decoded
    into ``spans``, each with its resource's attributes."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.keep(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def keep(self, request: Any) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self.lock:
                        self.spans.append({
                            "name": span.name, "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "events": [e.name for e in span.events],
                            "error": span.status.code == 2, "resource": resource})

    def named(self, prefix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"].startswith(prefix)]


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    found.thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()
    found.thread.join()


@pytest.fixture
def traced(collector: Collector, monkeypatch: pytest.MonkeyPatch) -> Collector:
    """Tracing on for the Troupers opened in the test (set before their processes are
    forked), to ``collector``. The batches are sent every 10 minutes only: what the
    collector gets, it gets from each process's flush as it exits."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    return collector


def test_each_turn_is_one_trace_with_the_model_call_and_the_action_as_children(
        tmp_path, scripted, traced):
    collector = traced
    _, llm = scripted([{"tool": "run", "args": {"command": "echo one"}},
                       {"tool": "run", "args": {"command": "echo two"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("trace me", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=90) == AgentState.FINISHED
        sid = session.id
    # closed: every actor process flushed its batch as it exited

    turns = wait_until(lambda: len(collector.named("turn")) >= 3 and collector.named(
        "turn"), timeout_s=30, what="three turn spans")
    wait_until(lambda: len(collector.named("chat ")) >= 3 and len(
        collector.named("action ")) >= 2, timeout_s=30, what="the children's spans")
    assert sorted(s["attributes"]["trouper.turn"] for s in turns) == [0, 1, 2]
    assert {s["attributes"]["trouper.session_id"] for s in turns} == {sid}
    assert all(s["parent_span_id"] == "" for s in turns)  # each the root of its trace
    assert len({s["trace_id"] for s in turns}) == 3  # one trace per turn
    assert {s["resource"]["trouper.role"] for s in turns} == {"controller"}
    assert {s["resource"]["service.name"] for s in collector.spans} == {"trouper"}

    by_trace = {s["trace_id"]: s for s in turns}
    calls, actions = collector.named("chat "), collector.named("action ")
    for call in calls:  # the broker's call: a child of its turn, from the broker's process
        turn = by_trace[call["trace_id"]]
        assert call["parent_span_id"] == turn["span_id"]
        assert call["resource"]["trouper.role"] == "broker"
        attrs = call["attributes"]
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "hosted_vllm/scripted"
        assert attrs["trouper.turn"] == turn["attributes"]["trouper.turn"]
        assert {"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
                "trouper.cost_usd", "trouper.retries"} <= set(attrs)
    assert len({c["trace_id"] for c in calls}) == 3  # one call a turn
    for action in actions:  # the RuntimeProxy's action: a child of its turn
        turn = by_trace[action["trace_id"]]
        assert action["parent_span_id"] == turn["span_id"]
        assert action["resource"]["trouper.role"] == "runtime"
        assert action["name"] == "action run"
        attrs = action["attributes"]
        assert attrs["trouper.tool"] == "run" and attrs["trouper.runtime"] == "local"
        assert attrs["trouper.status"] == "ok" and not action["error"]
        assert attrs["trouper.duration_s"] >= 0 and attrs["trouper.action_id"]
    assert sorted(by_trace[a["trace_id"]]["attributes"]["trouper.turn"]
                  for a in actions) == [0, 1]  # the finish turn runs nothing in the sandbox
    last = max(turns, key=lambda s: s["attributes"]["trouper.turn"])
    assert last["attributes"]["trouper.turn.end"] == "finished"  # ended as it settled


def test_a_runtime_proxy_killed_mid_action_shows_as_recovery_on_its_turn(
        tmp_path, scripted, traced):
    """The turn's trace tells the recovery: the sandbox's failure and re-attachment (the
    RuntimeEvents the Controller logged) and the journal asked what became of the
    action. The killed proxy's own span is lost with it (SIGKILL: no flush)."""
    _, llm = scripted([
        {"tool": "run", "args": {"command": "touch started; sleep 1.5; echo one >> ledger"}},
        {"tool": "run", "args": {"command": "cat ledger"}},
        {"tool": "finish", "args": {"message": "done"}}])
    workspace = tmp_path / "ws"
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("trace a recovery", llm=llm, workspace=workspace)
        wait_until(lambda: (workspace / "started").exists(), 30, "the command to start")
        kill_actor(session, "runtime")
        assert session.wait(timeout=90) == AgentState.FINISHED
    turns = wait_until(lambda: len(traced.named("turn")) >= 3 and traced.named("turn"),
                       timeout_s=30, what="three turn spans")
    first = next(s for s in turns if s["attributes"]["trouper.turn"] == 0)
    assert {"runtime.failed", "journal.resolve", "runtime.attached"} <= set(
        first["events"]), first["events"]
    wait_until(lambda: traced.named("action "), timeout_s=30, what="an action span")
    actions = [a for a in traced.named("action ") if a["trace_id"] == first["trace_id"]]
    assert actions == []  # run by the killed proxy: its batch died with it


NO_SDK_PROGRAM = textwrap.dedent("""
    import importlib.abc, json, os, sys
    from pathlib import Path

    record = Path(sys.argv[3])

    class Watch(importlib.abc.MetaPathFinder):
        # forked, not executed: every actor process inherits this finder
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                with open(record, "a") as f:
                    f.write(f"{os.getpid()} {name}\\n")
            return None

    sys.meta_path.insert(0, Watch())
    from trouper import Trouper
    from trouper.testing import FakeLLMServer, load_script

    home, workspace = Path(sys.argv[1]), sys.argv[2]
    script = load_script([{"tool": "run", "args": {"command": "echo hi"}},
                          {"tool": "finish", "args": {"message": "done"}}])
    with FakeLLMServer(script) as server, Trouper(home=home) as t:
        session = t.start_session("t", llm={"model": "hosted_vllm/x", "base_url": server.url,
                                            "api_key": "k"}, workspace=workspace)
        state = session.wait(timeout=60).value
    print(json.dumps({"state": state, "program": sorted(
        m for m in sys.modules if m.startswith("opentelemetry"))}))
""")


def test_without_an_endpoint_no_process_imports_opentelemetry(tmp_path):
    """A program of its own (this one may have imported OpenTelemetry for another test):
    an import hook it installs first is inherited by every actor process it forks, and
    records any import of ``opentelemetry`` anywhere."""
    record = tmp_path / "imports.txt"
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", NO_SDK_PROGRAM, str(tmp_path / "home"),
                           str(tmp_path / "ws"), str(record)], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["state"] == "finished"
    assert report["program"] == []
    assert not record.exists(), record.read_text()  # no actor process imported it either


def test_a_run_with_the_hook_set_does_record_an_import(tmp_path):
    """The hook of the test above sees an actor's import (it would pass vacuously if
    forked processes did not inherit it)."""
    record = tmp_path / "imports.txt"
    program = NO_SDK_PROGRAM.replace(
        "\nwith FakeLLMServer",
        "\nos.environ['OTEL_EXPORTER_OTLP_ENDPOINT'] = 'http://127.0.0.1:9'\n"
        "with FakeLLMServer")
    assert program != NO_SDK_PROGRAM
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path / "home"),
                           str(tmp_path / "ws"), str(record)], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["program"] == []  # the program itself traces nothing
    pids = {line.split()[0] for line in record.read_text().splitlines()}
    assert len(pids) >= 2, record.read_text()  # the Controller, the broker, the proxy


def test_log_records_name_the_open_turns_trace(collector, monkeypatch):
    """``current_trace_id`` (the JSON logs' ``trace_id``): the open turn's trace in a
    process that traces, the current span's on a worker running one, None otherwise."""
    from trouper.config.models import LLMConfig
    from trouper.home.log_format import current_trace_id
    from trouper.messages.protocol import Complete
    from trouper.observability import tracing

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.url + "/v1/traces")
    monkeypatch.setattr(tracing, "_state", dict(tracing._state, pid=0))  # read again here
    turns = tracing.TurnTraces()
    request = Complete(request_id="r1", session_id="s-1", llm=LLMConfig(model="m"),
                       messages=[], turn=4)
    sent = turns.asked(request, "s-1")
    assert sent.trace is not None and turns.carry(request).trace == sent.trace
    turn_trace = sent.trace["traceparent"].split("-")[1]
    assert current_trace_id() == turn_trace
    call = tracing.model_call_began(sent)
    assert tracing.within(call, current_trace_id)() == turn_trace
    tracing.model_call_failed(call, "cancelled")
    turns.end("test")
    assert current_trace_id() is None and turns.carry(request).trace is None
    tracing.flush_at_exit()
    spans = wait_until(lambda: len(collector.spans) >= 2 and collector.spans, timeout_s=30,
                       what="the two spans")
    assert {s["trace_id"] for s in spans} == {turn_trace}
    assert {s["name"] for s in spans} == {"turn", "chat m"}


class _Span:
    """A span's calls, as the SDK would take them."""

    def __init__(self) -> None:
        self.status: Any = None
        self.ended = False

    def set_status(self, status: Any) -> None:
        self.status = status

    def set_attribute(self, name: str, value: Any) -> None:
        pass

    def end(self) -> None:
        self.ended = True


def test_a_failed_action_s_span_carries_its_error_masked():
    from trouper.observability import tracing
    from trouper.security.masking import remember_secrets

    remember_secrets({"API_TOKEN": "tok-9f8e7d6c5b4a"})
    span = _Span()
    tracing.action_ended(span, None, RuntimeError("refused tok-9f8e7d6c5b4a"))
    assert span.ended and "<secret:API_TOKEN" in span.status.description  # _2 if taken
    assert "tok-9f8e7d6c5b4a" not in span.status.description


def test_a_tracing_call_that_raises_turns_tracing_off_and_never_reaches_the_handler(
        monkeypatch):
    from trouper.observability import tracing

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("an SDK refusing a value")

    monkeypatch.setitem(tracing._state, "on", True)
    monkeypatch.setattr(tracing, "_begin", broken)

    class Msg:
        trace = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        session_id, action_id, action = "s-1", "a-1", type("A", (), {"kind": "run"})()

    assert tracing.action_began(Msg(), "local") is None
    assert tracing._state["on"] is False


def test_the_collector_s_credentials_are_masked_in_what_this_process_logs(monkeypatch):
    from trouper.observability.otlp_credentials import remember_otlp_credentials
    from trouper.security.masking import mask_known

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer otlp-5a6b7c8d9e")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://u:pw-1a2b3c4d5e@c.test/v1")
    remember_otlp_credentials(["OTEL_EXPORTER_OTLP_ENDPOINT"])
    shown = mask_known("export to https://u:pw-1a2b3c4d5e@c.test failed: Bearer otlp-5a6b7c8d9e")
    assert "pw-1a2b3c4d5e" not in shown and "otlp-5a6b7c8d9e" not in shown
