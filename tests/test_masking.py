"""Secret values never reach stored, shown or prompted text."""

from __future__ import annotations

import json

from trouper.masking import MIN_SECRET_CHARS, SecretMasker
from trouper.messages.actions import RunCommand
from trouper.messages.events import ActionEvent, MessageEvent, ObservationEvent
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import Complete, Completed, ToolCall

TOKEN = "ghp_abcdef123456"


def run_event(command: str) -> ActionEvent:
    return ActionEvent(
        action_id="a1",
        turn_id="t1",
        tool_call_id="c1",
        tool="run",
        arguments=json.dumps({"command": command}),
        action=RunCommand(command=command),
        thought=f"I will use {TOKEN}",
    )


def test_plain_text():
    masker = SecretMasker({"GITHUB_TOKEN": TOKEN})
    text = f"token={TOKEN}\nagain {TOKEN}!"
    assert masker.mask_text(text) == "token=<secret:GITHUB_TOKEN>\nagain <secret:GITHUB_TOKEN>!"


def test_longest_value_first():
    masker = SecretMasker({"SHORT": "abcd", "LONG": "abcd-efgh"})
    assert masker.mask_text("abcd-efgh abcd") == "<secret:LONG> <secret:SHORT>"


def test_short_and_empty_values_are_ignored():
    masker = SecretMasker({"EMPTY": "", "TINY": "abc", "OK": "x" * MIN_SECRET_CHARS})
    assert masker.mask_text("abc xxxx") == "abc <secret:OK>"
    assert not SecretMasker({"EMPTY": "", "TINY": "abc"}).enabled


def test_masking_twice_equals_masking_once():
    masker = SecretMasker({"K": "secret", "NAME": "NAME-value"})
    once = masker.mask_text("secret and NAME-value")
    assert once == "<secret:K> and <secret:NAME>"
    assert masker.mask_text(once) == once


def test_placeholder_lookalike_does_not_hide_a_secret():
    masker = SecretMasker({"K": TOKEN})
    assert masker.mask_text(f"<secret:{TOKEN}>") == "<secret:<secret:K>>"


def test_json_escaped_value_is_masked():
    value = 'pa"ss\\word'
    masker = SecretMasker({"PW": value})
    raw = json.dumps({"command": f"login {value}"})
    assert value not in json.loads(masker.mask_text(raw))["command"]
    assert "<secret:PW>" in masker.mask_text(raw)


def test_shared_value_shows_one_name():
    masker = SecretMasker({"B": TOKEN, "A": TOKEN})
    assert masker.mask_text(TOKEN) == "<secret:A>"


def test_nested_action_is_masked():
    masker = SecretMasker({"GITHUB_TOKEN": TOKEN})
    event = run_event(f"git clone https://{TOKEN}@github.com/x/y")
    masked = masker.mask_event(event)
    assert TOKEN not in masked.model_dump_json()
    assert masked.action == RunCommand(
        command="git clone https://<secret:GITHUB_TOKEN>@github.com/x/y"
    )
    assert json.loads(masked.arguments)["command"] == masked.action.command
    assert masked.thought == "I will use <secret:GITHUB_TOKEN>"
    assert masked.action_id == "a1" and masked.ts == event.ts
    assert TOKEN in event.model_dump_json()  # the original is untouched


def test_observation_and_protocol_messages_are_masked():
    masker = SecretMasker({"K": TOKEN})
    observation = ObservationEvent(action_id="a", outcome=Outcome(status="ok", content=TOKEN))
    assert masker.mask_event(observation).outcome.content == "<secret:K>"
    completed = Completed(
        request_id="r",
        session_id="s",
        content=f"use {TOKEN}",
        tool_calls=[ToolCall(id="c", name="run", arguments=json.dumps({"command": TOKEN}))],
    )
    assert TOKEN not in masker.mask_event(completed).model_dump_json()


def test_dicts_lists_and_tuples_are_walked():
    masker = SecretMasker({"K": TOKEN})
    complete = Complete(
        request_id="r",
        session_id="s",
        llm={"model": "m"},
        messages=[{"role": "user", "content": f"here {TOKEN}", TOKEN: [TOKEN, (1, TOKEN)]}],
    )
    masked = masker.mask_event(complete)
    assert TOKEN not in repr(masked)
    assert masked.messages[0]["<secret:K>"] == ["<secret:K>", (1, "<secret:K>")]
    assert masker.mask_event({"a": {TOKEN}}) == {"a": {"<secret:K>"}}


def test_unchanged_input_is_returned_as_is():
    masker = SecretMasker({"K": TOKEN})
    event = run_event("ls")
    event = event.model_copy(update={"thought": ""})
    assert masker.mask_event(event) is event
    text = "nothing secret here"
    assert masker.mask_text(text) is text


def test_no_secrets_is_a_no_op():
    masker = SecretMasker({})
    event = MessageEvent(source="user", text="anything")
    assert not masker.enabled
    assert masker.mask_event(event) is event
    text = "anything"
    assert masker.mask_text(text) is text


def test_reveal_turns_placeholders_back_into_values():
    from trouper.messages.actions import RunCommand

    masker = SecretMasker({"TOKEN": "abcd-1234", "OTHER": "zzzz-9999"})
    action = RunCommand(command="curl -H 'x: <secret:TOKEN>' <secret:UNKNOWN>")
    revealed = masker.reveal(action)
    assert revealed.command == "curl -H 'x: abcd-1234' <secret:UNKNOWN>"
    assert masker.mask_event(revealed) == action
    assert SecretMasker({}).reveal(action) is action
