"""A missing or refused API key is a permanent error: refused at start when it can be,
else ERROR after one request (never retried), naming the variable or flag to set."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import litellm
import pytest

from trouper import AgentState, ConfigError, LLMConfig, LLMRetry, Trouper
from trouper.exceptions import MissingCredentials
from trouper.llm.credentials import check_llm, missing_key_vars
from trouper.llm.errors import classify, sdk_refused_to_start

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

WRONG_KEY = "sk-wrong-key-for-tests-0192"
"""The OPENAI_API_KEY the module's actors start with; the fake refuses it."""
FINISH = {"tool": "finish", "args": {"message": "done"}}
PROMPT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def trouper(trouper_home: Path) -> Iterator[Trouper]:
    """A Trouper whose actors start with a wrong OPENAI_API_KEY and no Anthropic or Gemini
    key (an actor's environment is the one the actor system started with)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_API_KEY", WRONG_KEY)
        for name in ("ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
            env.delenv(name, raising=False)
        with Trouper(home=trouper_home) as t:
            yield t


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.relative_to(root).parts[:1] not in {("logs",), ("actors",)}}


# -- at start_session: no key anywhere is refused at once, offline --------------------

def test_no_key_for_openai_is_refused_at_once_naming_the_variable(trouper, trouper_home,
                                                                  tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    before = (tree(trouper_home), tree(tmp_path), len(trouper.sessions()))
    started = time.monotonic()
    with pytest.raises(MissingCredentials) as caught:
        trouper.start_session("t", llm={"model": "openai/gpt-4o"}, workspace=tmp_path)
    assert time.monotonic() - started < 1.0
    error = caught.value
    assert isinstance(error, ConfigError) and error.field == "llm.api_key"
    assert error.names == ("OPENAI_API_KEY",)
    assert "set OPENAI_API_KEY or pass api_key (CLI: --api-key)" in str(error)
    assert (tree(trouper_home), tree(tmp_path), len(trouper.sessions())) == before


def test_a_fallback_without_a_key_is_refused_too(trouper, monkeypatch, tmp_path):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    llm = {"model": "openai/gpt-4o", "fallbacks": ["anthropic/claude-3-5-sonnet-20240620"]}
    with pytest.raises(MissingCredentials, match="ANTHROPIC_API_KEY"):
        trouper.start_session("t", llm=llm, workspace=tmp_path)


@pytest.mark.parametrize("llm", [
    {"model": "hosted_vllm/m"}, {"model": "hosted_vllm/m", "base_url": "http://127.0.0.1:9"},
    {"model": "ollama/llama3"}, {"model": "ollama/llama3", "base_url": "http://127.0.0.1:9"},
    {"model": "openai/gpt-4o", "api_key": "given"},
    {"model": "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0"},  # AWS: files, roles
])
def test_providers_that_need_no_key_or_have_one_pass(llm, monkeypatch):
    for name in [n for n in os.environ if n.endswith(("_API_KEY", "_API_TOKEN"))]:
        monkeypatch.delenv(name)
    check_llm(LLMConfig(**llm))


def test_missing_key_vars_name_every_alternative(monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    assert set(missing_key_vars("gemini/gemini-1.5-pro")) == {"GEMINI_API_KEY",
                                                               "GOOGLE_API_KEY"}
    monkeypatch.setenv("GOOGLE_API_KEY", "x")
    assert missing_key_vars("gemini/gemini-1.5-pro") == ()


def test_hosted_vllm_without_a_key_runs(trouper, scripted, tmp_path):
    server, llm = scripted([FINISH])
    llm = {k: v for k, v in llm.items() if k != "api_key"}
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert len(server.requests) == 1


# -- at run time: refused or missing credentials end the session, never retried -------

def ended_in_error(session, timeout_s: float = 30.0) -> str:
    started = time.monotonic()
    assert session.wait(timeout=timeout_s) == AgentState.ERROR
    assert time.monotonic() - started < 10.0, "an auth error must not wait for retries"
    return session.record.state_reason


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_from_the_environment_is_one_request_then_error(
        trouper, scripted, tmp_path, status):
    refusal = {"status": status, "message": f"Incorrect API key provided: {WRONG_KEY}"}
    server, llm = scripted([{**FINISH, "fail": [refusal]}, FINISH])
    llm = {"model": "openai/scripted", "base_url": llm["base_url"], "num_retries": 4}
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    reason = ended_in_error(session)
    assert len(server.requests) == 1
    assert [e for e in session.events() if isinstance(e, LLMRetry)] == []
    assert f"the model provider refused the credentials ({status})" in reason
    assert "set OPENAI_API_KEY or pass api_key (CLI: --api-key)" in reason
    assert WRONG_KEY not in reason and "<secret:OPENAI_API_KEY>" in reason


def test_a_refused_key_given_in_the_config_says_to_check_it(trouper, scripted, tmp_path):
    server, llm = scripted([{**FINISH, "fail": [{"status": 401}]}, FINISH])
    reason = ended_in_error(trouper.start_session("t", llm=llm, workspace=tmp_path))
    assert len(server.requests) == 1
    assert "refused the credentials (401): check the api_key (CLI: --api-key) given" in reason


def test_a_key_the_actors_never_saw_is_an_error_before_any_request(
        trouper, scripted, tmp_path, monkeypatch):
    """Set in this process after the actor system started: start_session sees it, the
    broker does not, and says so instead of calling (or retrying) the provider."""
    monkeypatch.setenv("GEMINI_API_KEY", "only-in-the-caller")
    server, llm = scripted([FINISH])
    # litellm itself would raise APIConnectionError here: transient, retried for minutes
    llm = {"model": "gemini/gemini-1.5-pro", "base_url": llm["base_url"]}
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    reason = ended_in_error(session)
    assert server.requests == [] and not any(isinstance(e, LLMRetry) for e in session.events())
    assert "no API key reached the model provider" in reason
    assert "set GOOGLE_API_KEY or GEMINI_API_KEY or pass api_key (CLI: --api-key)" in reason


# -- classification, offline ------------------------------------------------------------

def _raised(**kwargs: Any) -> BaseException:
    try:
        litellm.completion(messages=PROMPT, num_retries=0, max_retries=0, timeout=5,
                           **kwargs)
    except Exception as exc:  # noqa: BLE001 - the exception is what is tested
        return exc
    raise AssertionError("the call should have failed")


def test_a_missing_openai_key_at_call_time_is_auth_not_transient(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # fails inside the SDK before any connection: nothing listens on port 9 anyway
    error = _raised(model="openai/gpt-4o", api_base="http://127.0.0.1:9/v1")
    assert isinstance(error, litellm.InternalServerError)  # what litellm makes of it
    assert sdk_refused_to_start(error) and classify(error) == "auth"


def test_a_refused_connection_stays_transient():
    error = _raised(model="openai/gpt-4o", api_base="http://127.0.0.1:9/v1", api_key="k")
    assert not sdk_refused_to_start(error) and classify(error) == "transient"


@pytest.mark.parametrize("error, expected", [
    (litellm.APIError(401, "no", "p", "m"), "auth"),
    (litellm.APIError(403, "no", "p", "m"), "auth"),
    (litellm.AuthenticationError("no", "p", "m"), "auth"),
    (MissingCredentials("no key", ("X_API_KEY",)), "auth"),
    (litellm.APIError(503, "busy", "p", "m"), "transient"),
    (litellm.BadRequestError("bad", "m", "p"), "bad_request"),
])
def test_classify_by_type_and_status(error, expected):
    assert classify(error) == expected
