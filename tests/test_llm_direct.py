"""llm/direct.py: the direct route sends what ``litellm.completion`` sends and answers,
and fails, as it does: same request body and headers, same ``Completed``, same error
class, status and retry hint for each failure a provider can serve."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import litellm
import pytest

from trouper.client.actor_system import free_port
from trouper.config.models import LLMConfig
from trouper.config.settings import settings
from trouper.llm import client, direct
from trouper.llm.errors import classify, retry_after_s
from trouper.messages.protocol import Complete
from trouper.testing import FakeLLMServer
from trouper.testing.fake_llm import load_script

TOOLS = [{"type": "function", "function": {
    "name": "run", "description": "run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "make out.txt"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "c1", "type": "function",
        "function": {"name": "run", "arguments": '{"command": "echo one > out.txt"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "exit 0"},
    {"role": "assistant", "content": "done so far"},
    {"role": "user", "content": "go on, ünïcode too"},
]
"""A history in which the model answered twice: the fake server plays its step 2."""


def request_for(url: str, model: str = "hosted_vllm/scripted", **llm: Any) -> Complete:
    config = LLMConfig(model=model, base_url=url, **{"api_key": "k", **llm})
    return Complete(request_id="r", session_id="s-1", turn=2, llm=config,
                    messages=HISTORY, tools=TOOLS)


@pytest.fixture
def route(monkeypatch) -> Iterator[Any]:
    """``route("direct" | "litellm")``: send the following calls that way, and prove it
    (the other way raises)."""
    real_completion = litellm.completion

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("litellm.completion was called on the direct route")

    def choose(way: str) -> None:
        monkeypatch.setenv("TROUPER_LLM_ROUTE", way)
        settings.cache_clear()
        monkeypatch.setattr(litellm, "completion", refuse if way == "direct" else real_completion)

    yield choose
    settings.cache_clear()


def both_ways(route, call) -> tuple[Any, Any]:
    """What ``call()`` returns or raises, through litellm and then the direct route."""
    got = []
    for way in ("litellm", "direct"):
        route(way)
        try:
            got.append(call())
        except Exception as error:  # noqa: BLE001 - compared below
            got.append(error)
    return got[0], got[1]


def test_the_route_is_taken_only_for_a_named_openai_compatible_endpoint(route, monkeypatch):
    route("direct")
    given = LLMConfig(model="hosted_vllm/m", base_url="http://127.0.0.1:9/v1")
    assert direct.takes(given, "hosted_vllm/m")  # vLLM needs no key
    assert direct.takes(given.model_copy(update={"api_key": "k"}), "openai/gpt-4o-mini")
    assert not direct.takes(given, "openai/gpt-4o-mini"), "openai's key from the environment"
    assert not direct.takes(given.model_copy(update={"base_url": None}), "hosted_vllm/m")
    assert not direct.takes(given.model_copy(update={"api_key": "k"}), "anthropic/claude-3-5")
    monkeypatch.setattr(litellm, "success_callback", [lambda *a: None])
    assert not direct.takes(given, "hosted_vllm/m"), "a program's callback hears every call"
    monkeypatch.setattr(litellm, "success_callback", [])
    for name, value in (("api_key", "global-key"), ("headers", {"X-Team": "a"})):
        monkeypatch.setattr(litellm, name, value)
        assert not direct.takes(given, "hosted_vllm/m"), f"litellm.{name} is set"
        monkeypatch.setattr(litellm, name, None)
    assert direct.takes(given, "hosted_vllm/m")
    route("litellm")
    assert not direct.takes(given, "hosted_vllm/m")


def _own(headers: dict[str, str]) -> dict[str, str]:
    """The server's headers as the gate reads them, less its clock (two calls may fall in
    two seconds) and litellm's copies (``llm_provider-``)."""
    return {k: v for k, v in headers.items() if not k.startswith("llm_provider-") and k != "date"}


@pytest.mark.parametrize("model", ["hosted_vllm/scripted", "openai/gpt-4o-mini"])
def test_both_routes_send_the_same_request_and_read_the_same_answer(route, model):
    script = load_script([{"tools": [{"tool": "run", "args": {"command": "ls"}},
                                     {"tool": "think", "raw_args": "{not json"}],
                           "say": "two calls"}] * 3)
    with FakeLLMServer(script) as server:
        request = request_for(server.url, model, temperature=0.25, max_output_tokens=99)
        by_litellm, by_direct = both_ways(route, lambda: client.complete(request))
        sent = [r for r in server.requests if r.method == "POST"]
    assert len(sent) == 2
    assert sent[0].body["messages"] == sent[1].body["messages"]
    assert sent[0].body == sent[1].body and sent[0].path == sent[1].path
    assert sent[1].body["temperature"] == 0.25 and sent[1].body["max_tokens"] == 99
    for name in ("authorization", "content-type", "x-trouper-session", "x-trouper-turn"):
        assert sent[0].headers.get(name) == sent[1].headers.get(name), name
    (done_l, headers_l), (done_d, headers_d) = by_litellm, by_direct
    assert [c.id.rsplit("_", 2)[1:] for c in done_d.tool_calls] == [["2", "0"], ["2", "1"]]
    same = {"latency_s": 0.0, "tool_calls": [c.model_copy(update={"id": ""})  # the fake's ids
                                             for c in done_l.tool_calls]}  # are random
    assert done_d.model_copy(update=same) == done_l.model_copy(update=same)
    assert [c.name for c in done_d.tool_calls] == ["run", "think"]
    assert (done_d.cost_usd > 0) == model.startswith("openai/")
    assert _own(headers_d) == _own(headers_l)


def test_a_growing_history_is_sent_as_litellm_sends_it_each_time(route):
    """The direct route checks each plain message once and keeps the result for the
    next request, which carries the same dicts (the broker's history): each request
    still goes out as litellm sends it, and a message whose content was replaced in
    place is checked again, not sent as it was."""
    history = [dict(m) for m in HISTORY]
    with FakeLLMServer(load_script([{"say": "ok"}] * 12)) as server:
        for upto in (2, 4, 6, 6):
            if upto == 6 and len([r for r in server.requests if r.method == "POST"]) == 6:
                history[1]["content"] = "a new task, in the same dict"
            request = request_for(server.url).model_copy(update={"messages": history[:upto]})
            both_ways(route, lambda request=request: client.complete(request))
            by_litellm, by_direct = [r.body for r in server.requests if r.method == "POST"][-2:]
            assert by_direct == by_litellm
        assert by_direct["messages"][1]["content"] == "a new task, in the same dict"
        assert "content" not in by_direct["messages"][2]  # litellm drops None fields


@pytest.mark.parametrize("model", ["hosted_vllm/scripted", "openai/gpt-4o-mini"])
def test_both_routes_strip_cache_control_alike(route, model):
    """The direct route skips litellm's walk for ``cache_control`` keys when the history
    has none; where there is one (a block's, a message's, a tool's) both routes send the
    same body, and text that only names the key is sent as it is."""
    said = 'keep "cache_control" and cache_control in this text'
    history = [
        {"role": "system", "content": [{"type": "text", "text": "You are a coding agent.",
                                        "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": said, "cache_control": {"type": "ephemeral"}},
    ]
    tools = [{**TOOLS[0], "cache_control": {"type": "ephemeral"}}]
    plain = [dict(m) for m in HISTORY[:2]]  # known clean once sent: the tools still count
    for messages, tool_specs in ((history, tools), ([history[1] | {"content": said}], TOOLS),
                                 (plain, TOOLS), (plain, tools)):
        with FakeLLMServer(load_script([{"say": "ok"}] * 2)) as server:
            request = Complete(request_id="r", session_id="s-1", turn=1,
                               llm=LLMConfig(model=model, base_url=server.url, api_key="k"),
                               messages=messages, tools=tool_specs)
            both_ways(route, lambda request=request: client.complete(request))
            sent = [r.body for r in server.requests if r.method == "POST"]
        assert len(sent) == 2 and sent[0] == sent[1]
        assert said in str(sent[1]["messages"]) or messages is plain


@pytest.mark.parametrize("model", ["hosted_vllm/scripted", "openai/gpt-4o-mini"])
def test_both_routes_send_a_tools_schema_alike(route, model):
    """litellm rewrites tool schemas OpenAI's validator refuses (a top-level ``anyOf``, a
    ``pattern``) by the provider and endpoint: the direct route tells it both."""
    odd = {"type": "function", "function": {"name": "pick", "description": "pick one",
           "parameters": {"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
                          "properties": {"a": {"type": "string", "pattern": "(?<x>y)"},
                                         "b": {"type": "integer", "enum": [1, 2]}}}}}
    with FakeLLMServer(load_script([{"say": "ok"}] * 2)) as server:
        request = Complete(request_id="r", session_id="s-1", turn=1,
                           llm=LLMConfig(model=model, base_url=server.url, api_key="k"),
                           messages=HISTORY[:2], tools=[odd])
        both_ways(route, lambda: client.complete(request))
        sent = [r.body for r in server.requests if r.method == "POST"]
    assert len(sent) == 2 and sent[0]["tools"] == sent[1]["tools"]


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("model", ["openai/o3", "openai/gpt-5-mini"])
def test_both_routes_map_a_models_parameters_alike(route, monkeypatch, model, drop):
    """Reasoning models take max_completion_tokens and refuse a temperature, unless the
    program told litellm to drop what a model does not take."""
    monkeypatch.setattr(litellm, "drop_params", drop)
    with FakeLLMServer(load_script([{"say": "-"}] * 3)) as server:
        request = request_for(server.url, model, temperature=0.25, max_output_tokens=50)
        by_litellm, by_direct = both_ways(route, lambda: client.complete(request))
        sent = [r.body for r in server.requests if r.method == "POST"]
    if not drop:
        assert isinstance(by_litellm, litellm.UnsupportedParamsError) and sent == []
        assert type(by_direct) is type(by_litellm) and str(by_direct) == str(by_litellm)
        return
    assert len(sent) == 2 and sent[0] == sent[1]
    assert "temperature" not in sent[1] and sent[1]["max_completion_tokens"] == 50


FAILURES = [
    {"status": 429, "retry_after": 7},
    {"status": 429, "retry_after_ms": 1500, "headers": {"x-ratelimit-remaining-requests": "0"}},
    {"status": 400, "message": "This model's maximum context length is 8192 tokens. However, "
                               "your messages resulted in 9000 tokens."},
    {"status": 400, "message": "bad tool schema"},
    {"status": 401, "message": "invalid api key"},
    {"status": 403},
    {"status": 404, "message": "no such model"},
    {"status": 422},
    {"status": 500},
    {"status": 502},
    {"status": 503, "retry_after": 2},
    {"status": 504},
]


@pytest.mark.parametrize("failure", FAILURES, ids=lambda f: f"{f['status']}-{len(str(f))}")
def test_both_routes_fail_alike_for_each_error_a_provider_serves(route, failure):
    script = load_script([{"say": "-"}] * 2 + [{"say": "-", "fail": [failure, failure]}])
    with FakeLLMServer(script) as server:
        request = request_for(server.url)
        by_litellm, by_direct = both_ways(route, lambda: client.complete(request))
    assert_same_failure(by_litellm, by_direct)


def assert_same_failure(by_litellm: Any, by_direct: Any) -> None:
    assert isinstance(by_litellm, Exception), by_litellm
    assert type(by_direct) is type(by_litellm), (by_direct, by_litellm)
    assert getattr(by_direct, "status_code", None) == getattr(by_litellm, "status_code", None)
    assert classify(by_direct) == classify(by_litellm)
    assert retry_after_s(by_direct, now=0.0) == retry_after_s(by_litellm, now=0.0)
    said = str(by_direct).replace("(attempt 1)", "(attempt 0)")  # the fake counts attempts
    assert said == str(by_litellm)


def test_both_routes_time_out_alike(route):
    with FakeLLMServer(load_script([{"say": "late", "delay_s": 3.0}] * 3)) as server:
        request = request_for(server.url, timeout_s=0.3)
        by_litellm, by_direct = both_ways(route, lambda: client.complete(request))
    assert classify(by_litellm) == "transient"
    assert_same_failure(by_litellm, by_direct)


def test_both_routes_fail_alike_when_nothing_listens(route):
    request = request_for(f"http://127.0.0.1:{free_port()}/v1")
    by_litellm, by_direct = both_ways(route, lambda: client.complete(request))
    assert classify(by_litellm) == "transient"
    assert type(by_direct) is type(by_litellm)
    assert classify(by_direct) == classify(by_litellm)


class _Garbage(http.server.BaseHTTPRequestHandler):
    """Answers every POST 200 with a body that is not a chat completion."""

    body = b"<html>gateway says hi</html>"

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("body", [b"<html>gateway says hi</html>", b'{"choices": "none"}'])
def test_both_routes_refuse_a_body_that_is_no_completion_alike(route, body):
    handler = type("Garbage", (_Garbage,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        request = request_for(f"http://127.0.0.1:{server.server_port}/v1")
        by_litellm, by_direct = both_ways(route, lambda: client.complete(request))
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert isinstance(by_litellm, Exception)
    assert type(by_direct) is type(by_litellm)
    assert classify(by_direct) == classify(by_litellm)
