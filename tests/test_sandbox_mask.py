"""The sandbox's masker: whole texts, text in chunks, log lines, and the once-per limiter."""

from __future__ import annotations

import io
import json
import logging
import random

import pytest

from trouper.runtimes.sandbox.logs import MaskingFormatter, OncePer
from trouper.runtimes.sandbox.mask import MIN_SECRET_CHARS, TextMasker
from trouper.runtimes.sandbox.stream import StreamMasker
from trouper.security.masking import SecretMasker

TOKEN = "ghp_abcdef123456"
ODD = 'pa"ss\\wörd-42'
"""A value JSON spells three ways: raw, escaped, escaped with \\u for the umlaut."""


def test_plain_longest_first_and_short_values_ignored() -> None:
    masker = TextMasker({"SHORT": "abcd", "LONG": "abcd-efgh", "TINY": "abc", "EMPTY": ""})
    assert masker.mask("abcd-efgh abcd abc") == "<secret:LONG> <secret:SHORT> abc"
    assert masker.enabled and masker.pairs == [("LONG", "abcd-efgh"), ("SHORT", "abcd")]
    assert not TextMasker({"TINY": "x" * (MIN_SECRET_CHARS - 1)}).enabled


def test_every_json_spelling_is_masked() -> None:
    masker = TextMasker({"PW": ODD})
    for text in (ODD, json.dumps(ODD), json.dumps(ODD, ensure_ascii=False)):
        masked = masker.mask(f"x {text} y")
        assert masked.count("<secret:PW>") == 1 and "ss" not in masked


def test_masking_twice_equals_once_and_unchanged_text_is_returned_as_is() -> None:
    masker = TextMasker({"K": "secret", "NAME": "NAME-value"})
    once = masker.mask("secret and NAME-value")
    assert once == "<secret:K> and <secret:NAME>" and masker.mask(once) == once
    text = "nothing here"
    assert masker.mask(text) is text
    assert TextMasker({}).mask(text) is text


@pytest.mark.parametrize(
    "secrets",
    [{"K": TOKEN}, {"A": TOKEN, "B": TOKEN}, {"PW": ODD, "K": TOKEN, "S": "abcd"}],
)
def test_same_rules_as_trouper_masking(secrets: dict[str, str]) -> None:
    text = f"{TOKEN} {json.dumps(ODD)} abcd <secret:K> {ODD} <secret:{TOKEN}>"
    assert TextMasker(secrets).mask(text) == SecretMasker(secrets).mask_text(text)


def test_a_secret_split_at_any_point_is_masked_whole(chunked) -> None:
    masker = TextMasker({"K": TOKEN, "PW": ODD})
    text = f"start {TOKEN} mid {ODD}{TOKEN} {json.dumps(ODD)} end {TOKEN[:5]}"
    whole = masker.mask(text)
    for cut in range(len(text) + 1):
        assert chunked(masker, text, [cut]) == whole, cut


def test_random_chunkings_equal_the_whole(chunked) -> None:
    rng = random.Random(7)
    masker = TextMasker({"K": TOKEN, "S": "abcd", "PW": ODD})
    alphabet = ["a", "b", "c", "d", "g", "h", "p", "_", " ", "\n", TOKEN, ODD, "abcd", TOKEN[:9]]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        cuts = [rng.randint(0, len(text)) for _ in range(rng.randint(0, 12))]
        assert chunked(masker, text, cuts) == masker.mask(text), (text, cuts)


def test_stream_holds_back_only_what_could_start_a_secret() -> None:
    stream = StreamMasker(TextMasker({"K": TOKEN}))
    assert stream.feed("plain text, nothing held\n") == "plain text, nothing held\n"
    assert stream.feed("then ghp_ab") == "then " and stream.held_chars == len("ghp_ab")
    assert stream.feed("X") == "ghp_abX" and stream.held_chars == 0
    assert stream.feed(TOKEN[:-1]) == "" and stream.flush() == TOKEN[:-1]  # never completed
    assert StreamMasker(TextMasker({})).feed("ghp_") == "ghp_"


def test_log_lines_and_tracebacks_are_masked() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(MaskingFormatter(TextMasker({"K": TOKEN})))
    log = logging.getLogger("test-sandbox-mask")
    log.addHandler(handler)
    try:
        try:
            raise ValueError(f"bad token {TOKEN}")
        except ValueError:
            log.exception("failed with %s", TOKEN)
    finally:
        log.removeHandler(handler)
    assert TOKEN not in out.getvalue()
    assert out.getvalue().count("<secret:K>") == 2


def test_once_per_logs_once_a_period_per_key_with_a_count() -> None:
    now = [0.0]
    once = OncePer(period_s=60.0, clock=lambda: now[0], max_keys=3)
    assert once.due("a") == 0
    assert [once.due("a") for _ in range(5)] == [None] * 5
    assert once.due("b") == 0
    now[0] = 61.0
    assert once.due("a") == 5 and once.due("a") is None
    for key in ("c", "d", "e"):  # past max_keys the table starts afresh: memory is bounded
        once.due(key)
    assert once.due("a") == 0
