"""FakeLLMServer through litellm's real HTTP path, and the script loader."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm  # noqa: E402

from trouper.testing import FakeLLMServer, Script, ScriptError, load_script  # noqa: E402

litellm.suppress_debug_info = True

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

ROUTE = "hosted_vllm/fake"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": True},
        },
    }
    for name in ("run", "write_file", "think", "finish")
]
DEMO = Path(__file__).resolve().parent.parent / "testing" / "demo_script.json"


def user(text: str = "do the task") -> list[dict]:
    return [{"role": "user", "content": text}]


def with_turns(n: int, text: str = "do the task") -> list[dict]:
    """A conversation whose messages hold ``n`` assistant turns."""
    messages = user(text)
    for i in range(n):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok"})
    return messages


def complete(server: FakeLLMServer, messages: list[dict], model: str = ROUTE, **kwargs):
    return litellm.completion(
        model=model,
        api_base=server.url,
        api_key="x",
        messages=messages,
        tools=TOOLS,
        num_retries=0,
        max_retries=0,
        timeout=5,
        **kwargs,
    )


def raw_post(server: FakeLLMServer, body: bytes, path: str = "/v1/chat/completions"):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        conn.close()


# ---- completions through litellm ----


@pytest.mark.parametrize("model", ["hosted_vllm/fake", "openai/fake"])
def test_tool_call_step_is_parsed_by_litellm(model):
    script = [{"tool": "run", "args": {"command": "echo one >> ledger.txt"}}]
    with FakeLLMServer(script) as server:
        response = complete(server, user(), model=model)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "run"
    assert json.loads(call.function.arguments) == {"command": "echo one >> ledger.txt"}
    assert call.id
    assert response.model.endswith("fake")
    assert response.usage.prompt_tokens > 0
    assert response.usage.completion_tokens > 0


def test_multi_tool_step_gives_every_call_a_unique_id():
    script = [
        {
            "tools": [
                {"tool": "run", "args": {"command": "true"}},
                {"tool": "think", "args": {"thought": "x"}},
            ]
        }
    ]
    with FakeLLMServer(script) as server:
        calls = complete(server, user()).choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["run", "think"]
    assert json.loads(calls[1].function.arguments) == {"thought": "x"}
    assert len({c.id for c in calls}) == 2


def test_say_step_ends_the_turn_with_text():
    with FakeLLMServer([{"say": "all done here"}]) as server:
        choice = complete(server, user()).choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == "all done here"
    assert not choice.message.tool_calls


def test_say_beside_tools_is_the_content():
    script = [{"say": "let me look", "tool": "run", "args": {"command": "ls"}}]
    with FakeLLMServer(script) as server:
        choice = complete(server, user()).choices[0]
    assert choice.message.content == "let me look"
    assert choice.message.tool_calls[0].function.name == "run"
    assert choice.finish_reason == "tool_calls"


def test_unknown_tool_names_are_served():
    with FakeLLMServer([{"tool": "no_such_tool", "args": {}}]) as server:
        call = complete(server, user()).choices[0].message.tool_calls[0]
    assert call.function.name == "no_such_tool"


def test_raw_args_are_served_verbatim():
    with FakeLLMServer([{"tool": "run", "raw_args": "{not json"}]) as server:
        call = complete(server, user()).choices[0].message.tool_calls[0]
    assert call.function.arguments == "{not json"


def test_step_follows_the_assistant_turns_in_the_conversation():
    script = [{"say": "zero"}, {"say": "one"}, {"say": "two"}]
    with FakeLLMServer(script) as server:
        assert complete(server, with_turns(2)).choices[0].message.content == "two"
        assert complete(server, with_turns(0)).choices[0].message.content == "zero"
        assert complete(server, with_turns(1)).choices[0].message.content == "one"
        past_end = complete(server, with_turns(5)).choices[0]
    assert past_end.finish_reason == "stop"
    assert "no step 5" in past_end.message.content


# ---- scripted failures ----


def test_fail_list_is_served_in_order_then_the_step_succeeds():
    script = [
        {
            "tool": "write_file",
            "args": {"path": "hello.txt", "content": "hi"},
            "fail": [
                {"status": 429, "retry_after": 1, "retry_after_ms": 1500, "headers": {"X-A": "b"}},
                {"status": 500, "message": "boom"},
            ],
        }
    ]
    with FakeLLMServer(script) as server:
        with pytest.raises(litellm.RateLimitError) as limited:
            complete(server, user())
        headers = limited.value.litellm_response_headers
        assert headers["retry-after"] == "1"
        assert headers["retry-after-ms"] == "1500"
        assert headers["x-a"] == "b"
        with pytest.raises(litellm.InternalServerError, match="boom"):
            complete(server, user())
        response = complete(server, user())
        assert response.choices[0].message.tool_calls[0].function.name == "write_file"
        assert [r.status for r in server.requests] == [429, 500, 200]


def test_fail_counters_are_kept_per_conversation():
    script = [{"say": "ok", "fail": [{"status": 503}]}]
    with FakeLLMServer(script) as server:
        for session in ("s1", "s2"):
            headers = {"X-Trouper-Session": session}
            with pytest.raises(litellm.ServiceUnavailableError):
                complete(server, user(), extra_headers=headers)
            assert complete(server, user(), extra_headers=headers).choices[0].message.content
        with pytest.raises(litellm.ServiceUnavailableError):
            complete(server, user("another task"))  # keyed by the first user message
        assert complete(server, user("another task")).choices[0].message.content == "ok"


def test_error_body_is_openai_style():
    with FakeLLMServer([{"say": "x", "fail": [{"status": 429, "retry_after": 2}]}]) as server:
        status, headers, body = raw_post(server, json.dumps({"messages": user()}).encode())
    assert status == 429
    assert headers["Retry-After"] == "2"
    assert body["error"]["type"] == "rate_limit_error"
    assert "step 0" in body["error"]["message"]


def test_step_delay_and_latency_slow_the_answer():
    script = [{"say": "slow", "delay_s": 0.3}, {"say": "fast"}]
    with FakeLLMServer(script, latency_s=0.1) as server:
        started = time.monotonic()
        complete(server, with_turns(0))
        slow_s = time.monotonic() - started
        started = time.monotonic()
        complete(server, with_turns(1))
        fast_s = time.monotonic() - started
    assert slow_s >= 0.4  # latency + the step's delay
    assert 0.1 <= fast_s < slow_s  # latency only


def test_delay_longer_than_the_client_timeout_times_out():
    with FakeLLMServer([{"say": "late", "delay_s": 1.0}]) as server:
        with pytest.raises(litellm.Timeout):
            litellm.completion(
                model=ROUTE, api_base=server.url, api_key="x", messages=user(),
                num_retries=0, max_retries=0, timeout=0.2,
            )  # fmt: skip


def test_rpm_limit_answers_429_with_retry_after():
    with FakeLLMServer([{"say": "ok"}], rpm=2) as server:
        complete(server, user())
        complete(server, user())
        with pytest.raises(litellm.RateLimitError) as limited:
            complete(server, user())
    retry_after_s = int(limited.value.litellm_response_headers["retry-after"])
    assert 1 <= retry_after_s <= 60
    assert [r.status for r in server.requests] == [200, 200, 429]


# ---- what the server records, concurrency, bad input ----


def test_requests_record_body_headers_step_and_status():
    with FakeLLMServer([{"say": "a"}, {"say": "b"}]) as server:
        complete(server, with_turns(1), extra_headers={"X-Trouper-Session": "sess-7"})
        [request] = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == "fake"
    assert request.body["messages"][0]["content"] == "do the task"
    assert request.headers["x-trouper-session"] == "sess-7"
    assert request.conversation == "sess-7"
    assert request.step == 1
    assert request.status == 200
    assert request.time_s <= time.time()


def test_concurrent_conversations_each_get_their_own_step():
    script = [{"say": "s0"}, {"say": "s1", "fail": [{"status": 500}]}, {"say": "s2"}]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def converse(n: int) -> None:
        try:
            step = n % 3
            messages = with_turns(step, text=f"task {n}")
            if step == 1:
                with pytest.raises(litellm.InternalServerError):
                    complete(server, messages)
            results[n] = complete(server, messages).choices[0].message.content
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    with FakeLLMServer(script) as server:
        threads = [threading.Thread(target=converse, args=(n,)) for n in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
    assert not errors
    assert results == {n: f"s{n % 3}" for n in range(24)}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"model": "m"}', "'messages'"),
        (b'{"messages": [{"content": "x"}]}', "messages[0]"),
    ],
)
def test_bad_request_body_gets_400(body, fragment):
    with FakeLLMServer([{"say": "x"}]) as server:
        status, _, answer = raw_post(server, body)
        assert server.requests[0].status == 400
    assert status == 400
    assert fragment in answer["error"]["message"]


def test_path_without_v1_and_model_list():
    with FakeLLMServer([{"say": "x"}]) as server:
        status, _, body = raw_post(
            server, json.dumps({"messages": user()}).encode(), "/chat/completions"
        )
        assert status == 200
        assert body["object"] == "chat.completion"
        assert raw_post(server, b"{}", "/v1/nothing")[0] == 404
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("GET", "/v1/models")
        models = json.loads(conn.getresponse().read())
        conn.close()
    assert models["data"][0]["id"] == "fake"


# ---- lifecycle ----


def test_start_and_stop_are_idempotent_and_restart_keeps_the_port():
    server = FakeLLMServer([{"say": "x", "fail": [{"status": 500}]}])
    try:
        server.start()
        port = server.port
        assert server.start() is server
        with pytest.raises(litellm.InternalServerError):
            complete(server, user())
        server.stop()
        server.stop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((server.host, port), timeout=2)
        server.start()
        assert server.port == port
        assert complete(server, user()).choices[0].message.content == "x"
    finally:
        server.stop()


def test_stop_closes_idle_keep_alive_connections():
    server = FakeLLMServer([{"say": "x"}]).start()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({"messages": user()}))
        assert conn.getresponse().read()
        server.stop()
        conn.sock.settimeout(2)
        assert conn.sock.recv(1) == b""  # closed by the server, not left hanging
    finally:
        conn.close()
        server.stop()


def test_serve_runs_until_sigterm(tmp_path):
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"say": "from the cli"}]))
    code = f"from trouper.testing import serve; serve({str(path)!r}, '127.0.0.1', 0)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.split(" at ")[1].strip()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        server = FakeLLMServer([{"say": "unused"}], port=port)  # only for .url / .host
        assert complete(server, user()).choices[0].message.content == "from the cli"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        proc.kill()
        proc.wait(timeout=5)
        proc.stdout.close()


# ---- the script loader ----


def test_loader_accepts_a_file_a_list_and_a_steps_object(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"steps": [{"say": "hi"}]}))
    assert load_script(path).steps[0].say == "hi"
    assert load_script(str(path)) == load_script([{"say": "hi"}])
    script = load_script([{"say": "hi"}])
    assert load_script(script) is script
    assert isinstance(script, Script)


@pytest.mark.parametrize(
    ("steps", "fragment"),
    [
        (
            [{"say": "ok"}, {"tool": "run", "fail": [{"status": 200}]}],
            "step 1, field 'fail[0].status'",
        ),
        ([{"say": "ok", "colour": "red"}], "step 0, field 'colour'"),
        ([{"tool": "run", "tools": [{"tool": "x"}]}], "step 0: Value error, give either 'tool'"),
        ([{"tools": []}], "at least one tool call"),
        ([{"args": {"a": 1}, "say": "x"}], "'args' and 'raw_args' need 'tool'"),
        ([{"tool": "run", "args": {}, "raw_args": "{}"}], "not both"),
        ([{"delay_s": 1}], "needs 'tool', 'tools' or 'say'"),
        ([{"tools": [{"tool": "run", "argz": {}}]}], "step 0, field 'tools[0].argz'"),
        ([{"say": "x"}, "run"], "step 1: Input should be a valid dictionary"),
        ({"nope": []}, "JSON list of steps"),
    ],
)

def test_loader_names_the_step_and_field_of_a_bad_script(steps, fragment):
    with pytest.raises(ScriptError) as error:
        load_script(steps)
    assert fragment in str(error.value)


def test_loader_reports_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ScriptError, match="cannot read script"):
        load_script(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('[\n  {"say": "x"},\n  {oops}\n]')
    with pytest.raises(ScriptError, match="line 3 column 4"):
        load_script(bad)


# ---- the demo ----


def test_demo_script_validates_and_uses_the_agents_tools():
    script = load_script(DEMO)
    assert 6 <= len(script.steps) <= 9
    tools = {call.tool for step in script.steps for call in step.calls}
    assert tools == {"run", "write_file", "edit_file", "read_file", "think", "finish"}
    assert script.steps[-1].calls[-1].tool == "finish"


def test_demo_script_commands_succeed_in_an_empty_folder(tmp_path):
    """Play the demo's actions with a shell whose working folder persists."""
    cwd, cwd_file = tmp_path, tmp_path.parent / f"{tmp_path.name}.cwd"
    for k, step in enumerate(load_script(DEMO).steps):
        for call in step.calls:
            args = json.loads(call.arguments)
            target = tmp_path / args.get("path", "")
            if call.tool == "write_file":
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(args["content"])
            elif call.tool == "edit_file":
                text = target.read_text()
                assert text.count(args["old"]) == 1, f"step {k}: edit must match once"
                target.write_text(text.replace(args["old"], args["new"]))
            elif call.tool == "read_file":
                assert len(target.read_text().splitlines()) >= (args.get("end_line") or 1)
            elif call.tool == "run":
                command = f'{args["command"]}\nrc=$?; pwd > "$0"; exit $rc'
                done = subprocess.run(
                    ["bash", "-c", command, str(cwd_file)],
                    cwd=cwd, capture_output=True, text=True, timeout=20,
                )  # fmt: skip
                assert done.returncode == 0, f"step {k}: {done.stdout}{done.stderr}"
                cwd = Path(cwd_file.read_text().strip())
    assert cwd == tmp_path / "wordcount"


def test_a_server_that_keeps_no_bodies_still_answers_and_records_the_rest():
    script = [{"tool": "run", "args": {"command": "true"}}, {"say": "done"}]
    with FakeLLMServer(script, keep_bodies=False) as server:
        complete(server, user())
        complete(server, with_turns(1))
        [first, second] = server.requests
    assert first.body is None and second.body is None
    assert (first.step, second.step) == (0, 1) and first.status == second.status == 200
    assert first.headers.get("content-type") == "application/json"
