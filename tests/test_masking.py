"""Secret values never reach stored, shown or prompted text."""

from __future__ import annotations

import json

import pytest

from trouper.messages.actions import RunCommand
from trouper.messages.events import ActionEvent, MessageEvent, ObservationEvent
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import Complete, Completed, ToolCall
from trouper.security.masking import MIN_SECRET_CHARS, SecretMasker

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


# ---- every escaped spelling ----------------------------------------------------------

ODD = 'pa"ss/wö\\rd-𝄞'
"""A quote, a slash, a non-ASCII letter, a backslash and a character past U+FFFF."""


def spelled(value: str, spell) -> str:
    return "".join(spell(i, c) for i, c in enumerate(value))


def u_escape(c: str, upper: bool = False) -> str:
    units = c.encode("utf-16-be")
    codes = [int.from_bytes(units[i:i + 2], "big") for i in range(0, len(units), 2)]
    return "".join(f"\\u{code:04X}" if upper else f"\\u{code:04x}" for code in codes)


@pytest.mark.parametrize("spell", [
    lambda i, c: json.dumps(c)[1:-1],
    lambda i, c: json.dumps(c, ensure_ascii=False)[1:-1],
    lambda i, c: "\\/" if c == "/" else json.dumps(c)[1:-1],
    lambda i, c: u_escape(c, upper=True),
    lambda i, c: u_escape(c) if i % 2 else json.dumps(c, ensure_ascii=False)[1:-1],
], ids=["json", "json-utf8", "escaped-slash", "all-upper-hex", "mixed"])
def test_every_escaped_spelling_is_masked(spell):
    masker = SecretMasker({"PW": ODD})
    raw = '{"command": "login ' + spelled(ODD, spell) + ' now"}'
    assert json.loads(raw)["command"] == f"login {ODD} now"
    assert masker.mask_text(raw) == '{"command": "login <secret:PW> now"}'


def test_python_repr_spellings_are_masked():
    """As in an exception's text or a ``%r`` log argument."""
    value = "it's \"both\"\x07\\-zz"
    masker = SecretMasker({"PW": value})
    for text in (repr(value), repr([value]), repr(value.encode())):
        assert "<secret:PW>" in masker.mask_text(text), text


def test_json_inside_json_is_masked_at_every_level():
    masker = SecretMasker({"PW": ODD})
    twice = json.dumps({"arguments": json.dumps({"command": ODD})})
    assert "<secret:PW>" in masker.mask_text(twice)
    assert ODD not in json.loads(json.loads(masker.mask_text(twice))["arguments"])["command"]


def test_an_escaped_backslash_is_never_split():
    masker = SecretMasker({"PW": "abc\\"})
    raw = json.dumps({"c": "abc\\"})
    assert json.loads(masker.mask_text(raw)) == {"c": "<secret:PW>"}


def test_text_without_backslashes_skips_the_escape_rule():
    masker = SecretMasker({"PW": "pa/ss-wörd"})
    assert masker.mask_text("plain pa/ss-wörd") == "plain <secret:PW>"
    assert not any(rule.compiled for rule in masker._text.rules)  # no regex was built


# ---- names -------------------------------------------------------------------------


def test_pairs_keep_their_first_name_and_make_names_unique():
    masker = SecretMasker.of_pairs([("A", "value-one"), ("B", "value-one"), ("A", "value-two")])
    assert masker.mask_text("value-one value-two") == "<secret:A> <secret:A_2>"
    assert dict(masker.pairs) == {"A": "value-one", "A_2": "value-two"}


# ---- the process's registry and its log records ----------------------------------------

REGISTERED = "registered-secret-8d7c6b"


def test_log_records_are_masked_where_they_are_made():
    import logging

    from trouper.security.masking import mask_known, remember_secrets

    remember_secrets({"REG": REGISTERED})
    assert mask_known(f"x {REGISTERED}") == "x <secret:REG>"
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    log = logging.getLogger("any.library.at.all")
    log.addHandler(handler)
    try:
        log.warning("args %s and %r", REGISTERED, {"k": REGISTERED})
        try:
            raise ValueError(f"failed with {REGISTERED!r}")
        except ValueError:
            log.exception("caught")
        log.warning(f"in the format {REGISTERED}", stack_info=True)
    finally:
        log.removeHandler(handler)
    rendered = "\n".join(logging.Formatter().format(r) for r in seen)
    assert REGISTERED not in rendered
    assert rendered.count("<secret:REG>") >= 4
    assert seen[1].exc_text and "ValueError" in seen[1].exc_text


def test_registry_keeps_two_sessions_values_under_one_name():
    from trouper.security.masking import known_masker, remember_secrets

    remember_secrets({"GITHUB_TOKEN": "first-session-token"})
    remember_secrets({"GITHUB_TOKEN": "second-session-token"})
    masked = known_masker().mask_text("first-session-token second-session-token")
    assert "first-session" not in masked and "second-session" not in masked


def test_three_levels_deep_is_masked():
    masker = SecretMasker({"PW": ODD})
    thrice = json.dumps({"error": json.dumps({"arguments": json.dumps({"command": ODD})})})
    assert "<secret:PW>" in masker.mask_text(thrice)


@pytest.mark.timeout(30)  # linear: well under a second; quadratic: hours (no timed assert)
def test_a_long_run_of_backslashes_costs_linear_time():
    masker = SecretMasker({"PW": ODD, "OTHER": "other-value"})
    assert masker.mask_text("\\" * 200_000 + "u00").endswith("u00")


# ---- any string: lone surrogates, other normal forms ------------------------------------

LONE = "tok\ud800en-77f1"
"""A secret holding a lone surrogate: text that is made storable holds U+FFFD there."""


@pytest.mark.parametrize("shown", [
    LONE,
    "tok\ufffden-77f1",          # the storable form (messages, configs, the store)
    "tok?en-77f1",               # encoded with errors="replace"
    "token-77f1",                # the surrogate dropped (errors="ignore")
])
def test_a_value_with_a_lone_surrogate_is_masked_in_every_form_text_takes(shown):
    masker = SecretMasker({"LONE": LONE})
    assert masker.mask_text(f"use {shown} now") == "use <secret:LONE> now"
    assert dict(masker.pairs) == {"LONE": LONE}  # the forms are the masker's, not pairs


def test_a_value_is_masked_in_every_unicode_normal_form():
    import unicodedata

    value = "caf\u00e9-\ufb01-secret"  # é precomposed, and the ligature ﬁ
    masker = SecretMasker({"UNI": value})
    for form in ("NFC", "NFD", "NFKC", "NFKD"):
        shown = unicodedata.normalize(form, value)
        assert masker.mask_text(f"[{shown}]") == "[<secret:UNI>]", form


def test_a_storable_event_holding_a_lone_surrogate_secret_is_masked():
    masker = SecretMasker({"LONE": LONE})
    event = MessageEvent(source="user", text=f"the key is {LONE}")  # made storable
    assert "\ufffd" in event.text
    assert masker.mask_event(event).text == "the key is <secret:LONE>"
