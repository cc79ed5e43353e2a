"""I7 (docs/promises.md), two sets: the model may use the user's sandbox secrets, never a
credential.

A scripted model that writes ``<secret:LLM_API_KEY>`` (or any other credential's name)
gets that text in its command and output, never the key; the user's own secret is used.
The command reverses and writes what it got, so a revealed key would show through the
masking (a reversed key is no longer the key's spelling).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trouper import ActionEvent, AgentState, ObservationEvent
from trouper.config.models import LLMConfig
from trouper.messages.actions import RunCommand
from trouper.security.masking import (
    LLM_KEY_NAME,
    TRANSPORT_KEY_NAME,
    credentials,
    session_maskers,
)
from trouper.security.transport_key import TRANSPORT_KEY_FILE_ENV

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

API_KEY = "sk-test-SETS-0a1b2c3d4e5f"
MINE = "user-token-77e1d0"
CREDENTIAL_NAMES = (LLM_KEY_NAME, TRANSPORT_KEY_NAME, f"TROUPER_{LLM_KEY_NAME}")


def probe(name: str, filename: str) -> dict:
    """A step that writes what ``<secret:name>`` became to a file, and prints it reversed."""
    placeholder = f"<secret:{name}>"
    return {"tool": "run", "args": {
        "command": f"printf %s '{placeholder}' > {filename}; printf %s '{placeholder}' | rev"}}


def test_credentials_are_never_revealed_to_the_sandbox(trouper, scripted, tmp_path: Path):
    steps = [probe(name, f"got{i}.txt") for i, name in enumerate(CREDENTIAL_NAMES)]
    steps += [probe("MINE", "mine.txt"), {"tool": "finish", "args": {"message": "done"}}]
    server, llm = scripted(steps)
    session = trouper.start_session("t", llm={**llm, "api_key": API_KEY}, workspace=tmp_path,
                                    secrets={"MINE": MINE})
    assert session.wait(timeout=60) == AgentState.FINISHED
    events = list(session.events())
    outcomes = [e.outcome for e in events if isinstance(e, ObservationEvent)]
    for i, name in enumerate(CREDENTIAL_NAMES):
        placeholder = f"<secret:{name}>"
        assert (tmp_path / f"got{i}.txt").read_text() == placeholder
        assert outcomes[i].content == placeholder[::-1]
    # the control: the user's secret is for use, and a revealed value shows reversed
    assert (tmp_path / "mine.txt").read_text() == MINE
    assert outcomes[len(CREDENTIAL_NAMES)].content == MINE[::-1]
    commands = [e.action.command for e in events
                if isinstance(e, ActionEvent) and isinstance(e.action, RunCommand)]
    assert all("<secret:" in c for c in commands)
    seen = json.dumps([e.model_dump(mode="json") for e in events])
    seen += json.dumps([r.body for r in server.requests])
    for leaked in (API_KEY, API_KEY[::-1]):
        assert leaked not in seen


def test_mask_set_holds_every_credential_reveal_set_only_the_users():
    llm = LLMConfig(model="m", api_key=API_KEY)
    to_mask, to_reveal = session_maskers({"MINE": MINE}, llm)
    assert dict(to_mask.pairs) == {"MINE": MINE, LLM_KEY_NAME: API_KEY}
    assert to_reveal.names == {"MINE"}
    text = f"<secret:{LLM_KEY_NAME}> <secret:MINE>"
    assert to_reveal.reveal_text(text) == f"<secret:{LLM_KEY_NAME}> {MINE}"


def test_a_user_secret_named_like_a_credential_does_not_unmask_it():
    """A user's ``LLM_API_KEY`` is theirs to use; the real key is still masked, renamed."""
    to_mask, to_reveal = session_maskers({LLM_KEY_NAME: MINE}, LLMConfig(model="m",
                                                                         api_key=API_KEY))
    assert to_mask.mask_text(f"{API_KEY} {MINE}") == (
        f"<secret:TROUPER_{LLM_KEY_NAME}> <secret:{LLM_KEY_NAME}>")
    assert to_reveal.reveal_text(f"<secret:TROUPER_{LLM_KEY_NAME}>") == (
        f"<secret:TROUPER_{LLM_KEY_NAME}>")


def test_a_credential_the_user_also_passed_shows_the_users_name():
    """So the model can use what the user chose to give the sandbox."""
    to_mask, _ = session_maskers({"OPENAI_API_KEY": API_KEY}, LLMConfig(model="m",
                                                                          api_key=API_KEY))
    assert to_mask.mask_text(API_KEY) == "<secret:OPENAI_API_KEY>"


def test_an_operator_transport_key_file_is_a_credential(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    key_file = tmp_path / "transport.key"
    key_file.write_text("operator-shared-transport-key-0123456789abcdef\n")
    key_file.chmod(0o600)
    monkeypatch.setenv(TRANSPORT_KEY_FILE_ENV, str(key_file))
    found = credentials(None)
    assert found == {TRANSPORT_KEY_NAME: "operator-shared-transport-key-0123456789abcdef"}
    to_mask, to_reveal = session_maskers({}, None)
    assert to_mask.mask_text(f"cat gave {found[TRANSPORT_KEY_NAME]}") == (
        f"cat gave <secret:{TRANSPORT_KEY_NAME}>")
    assert not to_reveal.enabled


def test_a_refused_config_does_not_quote_a_secret_or_the_key(trouper, tmp_path: Path):
    from trouper import ConfigError

    with pytest.raises(ConfigError) as caught:
        trouper.start_session("t", llm={"model": "m", "api_key": API_KEY, "rpm": API_KEY},
                              workspace=tmp_path, secrets={"MINE": MINE}, max_iterations=MINE)
    assert "<secret:" in str(caught.value)
    assert API_KEY not in str(caught.value) and MINE not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_the_terminal_shows_known_secrets_masked_and_never_clips_one_in_half():
    from trouper.cli.render import render
    from trouper.messages.events import MessageEvent
    from trouper.security.masking import remember_secrets

    shown_secret = "render-secret-value-5b6c7d"
    remember_secrets({"SHOWN": shown_secret})
    text = "x" * 390 + shown_secret  # the 400-character clip falls inside the value
    line = render(MessageEvent(source="agent", text=text).model_copy(update={"seq": 1}))
    assert line is not None
    assert shown_secret[:4] not in line.plain and line.plain.endswith("<secret:S…")


def test_a_provider_error_that_echoes_the_key_is_masked(trouper, scripted, tmp_path: Path):
    echo = {"status": 401, "message": f"Incorrect API key provided: {API_KEY}"}
    _, llm = scripted([{"tool": "think", "args": {"thought": "x"}, "fail": [echo]}])
    session = trouper.start_session("t", llm={**llm, "api_key": API_KEY}, workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.ERROR
    reason = session.record.state_reason
    assert "auth" in reason and f"<secret:{LLM_KEY_NAME}>" in reason and API_KEY not in reason


def test_a_remote_runtime_token_is_a_credential_masked_and_never_revealed():
    from trouper.config.models import RemoteRuntime
    from trouper.security.masking import RUNTIME_TOKEN_NAME

    token = "rt-" + "z" * 30
    runtime = RemoteRuntime(url="http://127.0.0.1:9", token=token)
    to_mask, to_reveal = session_maskers({}, None, runtime)
    assert to_mask.mask_text(f"curl -H 'Bearer {token}'") == (
        f"curl -H 'Bearer <secret:{RUNTIME_TOKEN_NAME}>'")
    assert to_reveal.reveal_text(f"<secret:{RUNTIME_TOKEN_NAME}>") == (
        f"<secret:{RUNTIME_TOKEN_NAME}>")


def test_a_backend_failure_keeps_its_typed_cause():
    from trouper.exceptions import RuntimeUnavailable
    from trouper.messages.causes import RuntimeFailure
    from trouper.runtimes.call_failures import cause_of
    from trouper.runtimes.remote_errors import RemoteUnavailable

    assert cause_of(RemoteUnavailable("401", RuntimeFailure.UNAUTHORIZED)) == (
        RuntimeFailure.UNAUTHORIZED)
    assert cause_of(RuntimeUnavailable("gone")) == RuntimeFailure.UNREACHABLE
    assert cause_of(ValueError("x")) == RuntimeFailure.FAILED


def test_the_secrets_file_is_written_whole_and_durably(tmp_path: Path, monkeypatch) -> None:
    """The one file a restore needs (the session's secrets and key): fsynced, renamed into
    place, its folder fsynced, so a host crash leaves it whole or absent; a write that
    fails leaves neither a file nor a temporary."""
    import os

    from trouper.home.paths import Home
    from trouper.security.secrets_file import read_secrets, write_session_secrets

    home = Home(tmp_path / "home")
    llm = LLMConfig(model="hosted_vllm/x", api_key="sk-durable-1")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_session_secrets(home, "s-1", {"TOKEN": "t0k3n-value"}, llm)
    path = home.secrets_path("s-1")
    assert read_secrets(home, "s-1") == ({"TOKEN": "t0k3n-value"}, "sk-durable-1")
    assert path.stat().st_mode & 0o777 == 0o600
    assert [Path(p).name.startswith(".secrets.json.") for p in synced] == [True, False]
    assert synced[1] == str(path.parent)  # the rename made durable with its folder

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        write_session_secrets(home, "s-2", {"TOKEN": "x" * 12}, llm)
    assert sorted(p.name for p in home.secrets_path("s-2").parent.iterdir()) == []
