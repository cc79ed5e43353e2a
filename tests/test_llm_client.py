"""llm/client.py: litellm's success logging runs only when someone listens to it, and the
price of a call is the one litellm computed while building the response."""

from __future__ import annotations

import threading
import uuid

import litellm
import litellm.utils
import pytest

from trouper.config.models import LLMConfig
from trouper.llm import client
from trouper.messages.protocol import Complete
from trouper.testing import FakeLLMServer, wait_until
from trouper.testing.fake_llm import load_script


@pytest.fixture
def request_to():
    servers: list[FakeLLMServer] = []

    def make(model: str = "hosted_vllm/scripted", **llm: object) -> Complete:
        server = FakeLLMServer(load_script([{"say": "hello"}] * 5)).start()
        servers.append(server)
        config = LLMConfig(model=model, base_url=server.url, api_key="k", **llm)
        return Complete(request_id="r", session_id="s", llm=config,
                        messages=[{"role": "user", "content": "hi"}])

    yield make
    for server in servers:
        server.stop()


def test_no_success_logging_is_submitted_when_nobody_listens(request_to, monkeypatch):
    submitted = []
    real_submit = litellm.utils.executor.submit
    monkeypatch.setattr(litellm.utils.executor, "submit",
                        lambda *a, **k: submitted.append(a) or real_submit(*a, **k))
    completed, _ = client.complete(request_to())
    assert completed.content == "hello"
    assert submitted == []


def test_a_programs_own_litellm_callback_still_runs(request_to, monkeypatch):
    seen = threading.Event()

    def callback(kwargs, response, start, end):  # litellm's custom-function callback
        seen.set()

    monkeypatch.setattr(litellm, "success_callback", [callback])
    completed, _ = client.complete(request_to())
    assert completed.content == "hello"
    wait_until(seen.is_set, 10, "the program's litellm callback")


def test_configured_prices_win_and_unknown_models_cost_nothing(request_to):
    priced, _ = client.complete(request_to(input_cost_per_token=1.0, output_cost_per_token=2.0))
    assert priced.cost_usd == priced.prompt_tokens * 1.0 + priced.completion_tokens * 2.0 > 0
    unknown, _ = client.complete(request_to())
    assert unknown.cost_usd == 0.0


def test_a_known_model_is_priced_as_litellm_prices_it(request_to):
    completed, _ = client.complete(request_to(model="openai/gpt-4o-mini"))
    expected = litellm.cost_per_token(model="gpt-4o-mini",
                                      prompt_tokens=completed.prompt_tokens,
                                      completion_tokens=completed.completion_tokens)
    assert completed.cost_usd == pytest.approx(sum(expected)) and completed.cost_usd > 0


MCP_PROBE = """
import os, sys
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
from trouper.agent.tools import tool_specs
from trouper.config import LLMConfig
from trouper.llm import client
from trouper.messages.protocol import Complete
from trouper.testing import FakeLLMServer, load_script

client.preload_first_call()  # as opening an actor system does, before the broker forks
before = set(sys.modules)
with FakeLLMServer(load_script([{"tool": "run", "args": {"command": "ls"}}])) as server:
    config = LLMConfig(model="hosted_vllm/scripted", base_url=server.url, api_key="k")
    completed, _ = client.complete(Complete(
        request_id="r", session_id="s", llm=config,
        messages=[{"role": "user", "content": "hi"}], tools=tool_specs()))
handlers = ("mcp", "litellm.responses.mcp.chat_completions_handler",
            "litellm.responses.mcp.litellm_proxy_mcp_handler")
late = ({m.split(".")[0] for m in set(sys.modules) - before} & {"tiktoken", "httpcore", "h11"}
        | (set(sys.modules) - before) & {"litellm.proxy._types"})
print(completed.tool_calls[0].name, sorted(m for m in handlers if m in sys.modules),
      sorted(late))
"""


@pytest.mark.slow
def test_a_call_with_tools_loads_no_mcp_handler():
    """trouper's tools are plain functions: litellm is told so and skips its MCP gateway
    (the mcp package, starlette...: ~0.4 s of CPU and ~20 MB in the broker). And what the
    first call would load (the tokenizer, the HTTP transport) was preloaded, to be shared
    by forked brokers. Another process: this one may have loaded them already (forked from
    the suite's zygote, which imported what opening an actor system does)."""
    import subprocess
    import sys

    from accel import forkserver

    assert client.SKIP_MCP, "this litellm lost _skip_mcp_handler: see llm/client.py"
    probe = forkserver.run([sys.executable, "-c", MCP_PROBE], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.split() == ["run", "[]", "[]"]


def test_the_first_call_is_warmed_once_and_never_where_callbacks_listen(monkeypatch):
    """``preload_first_call`` makes one completion litellm answers itself, so that what a
    first call imports (~80 ms) is shared by the forked brokers; a program's litellm
    callbacks would hear of it, so with one set there is none."""
    made: list[dict] = []
    monkeypatch.setattr(litellm, "completion", lambda **kwargs: made.append(kwargs))
    monkeypatch.setattr(client, "_warmed", False)
    monkeypatch.setattr(litellm, "success_callback", [lambda *args: None])
    client.preload_first_call()
    assert made == []
    monkeypatch.setattr(litellm, "success_callback", [])
    client.preload_first_call()
    client.preload_first_call()
    assert len(made) == 1 and made[0]["mock_response"]  # nothing sent anywhere


def test_importing_any_model_module_keeps_litellm_off_the_network():
    """litellm fetches its price list from the internet on import unless told not to,
    whichever of trouper's model modules imports it first (a program now imports the
    credentials check on its own, after its actors' fork)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    done = subprocess.run([sys.executable, "-c", "import trouper.llm.credentials"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "model cost map" not in done.stderr, done.stderr


def test_a_model_priced_after_a_call_is_priced_from_then_on(request_to, monkeypatch):
    """An unknown model's missing price is remembered (finding it out is a sixth of a
    call's CPU), until the program registers prices: then it is asked again."""
    monkeypatch.setattr(litellm, "model_cost", dict(litellm.model_cost))  # undone after
    model = f"hosted_vllm/priced-later-{uuid.uuid4().hex[:8]}"  # no other test's model
    first, _ = client.complete(request_to(model))
    assert first.cost_usd == 0.0
    litellm.register_model({model: {
        "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6,
        "litellm_provider": "hosted_vllm", "mode": "chat"}})
    later, _ = client.complete(request_to(model))
    assert later.cost_usd > 0
    assert later.cost_usd == pytest.approx(later.prompt_tokens * 1e-6
                                           + later.completion_tokens * 2e-6)
