"""The sandbox's escape-aware masking (the one rule trouper and the sandbox share).

Whole texts are checked against the rule with no shortcut (one ``re.sub`` per value, of
a placeholder-or-spelling regex): the fast paths (``str`` methods, windows around anchor
characters) must never differ from it. Streams are checked against whole texts, cut at
every point and at random ones, with secrets spelled every way at several depths.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from trouper.runtimes.sandbox import mask as mask_module
from trouper.runtimes.sandbox.mask import TextMasker
from trouper.runtimes.sandbox.spelling import value_pattern
from trouper.runtimes.sandbox.stream import StreamMasker
from trouper.security.masking import SecretMasker

TOKEN = "ghp_abcdef123456"
ODD = 'pa"ss/wö\\rd-\U0001d11e'
"""A quote, a slash, a non-ASCII letter, a backslash and a character past U+FFFF."""
SECRETS = {"TOKEN": TOKEN, "ODD": ODD, "SUB": "abcdef12", "LT": "k<ey>-9Q", "REPL": "r\ufffdpl-7Z"}
"""``SUB`` is inside ``TOKEN``; ``LT`` and ``REPL`` take the placeholder-aware regex always."""


def reference(masker: TextMasker, text: str) -> str:
    """The rule, with no shortcut: per value, longest first, one placeholder-aware sub."""
    for name, value in masker.pairs:
        regex = re.compile(f"{masker.placeholders.pattern}|{value_pattern(value)}")
        text = regex.sub(lambda m, n=name: m.group(1) or f"<secret:{n}>", text)
    return text


def spell(char: str, form: str, depth: int) -> str:
    """One character as a JSON or Python string literal nested ``depth`` deep writes it."""
    code, run = ord(char), "\\" * 2 ** (depth - 1)
    short = {'"': '"', "'": "'", "/": "/", "\\": "\\", "\n": "n", "\t": "t"}
    if form == "short" and char in short:
        odd = "\\" * (2 ** depth - 1)
        return odd + short[char] if char in "\"'/\\" else run + short[char]
    if form == "x" and code < 0x100:
        return f"{run}x{code:02x}"
    if form == "U":
        return f"{run}U{code:08X}"
    if form in ("u", "x", "U", "short"):
        units = char.encode("utf-16-be")
        return "".join(f"{run}u{int.from_bytes(units[i:i + 2], 'big'):04X}"
                       for i in range(0, len(units), 2))
    return char


def random_spelling(rng: random.Random, value: str) -> str:
    depth = rng.choice([1, 1, 2, 3])
    return "".join(spell(c, rng.choice(["plain", "plain", "short", "u", "x", "U"]), depth)
                   for c in value)


NOISE = ["a", "b", "Z", "1", " ", "\n", "\\", "\\\\", '\\"', "\\n", "\\u00", "\\x6", "<",
         "<secret:", "<secret:TOKEN>", "<secret:LT", "\ufffd", "\udcff", "é", "ghp_", "r"]


def random_text(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(0, 14)):
        roll = rng.random()
        value = rng.choice(list(SECRETS.values()))
        if roll < 0.3:
            pieces.append(random_spelling(rng, value))
        elif roll < 0.4:  # a spelling cut short
            spelled = random_spelling(rng, value)
            pieces.append(spelled[: rng.randint(1, len(spelled))])
        else:
            pieces.append(rng.choice(NOISE))
    return "".join(pieces)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("form", ["plain", "short", "u", "x", "U"])
def test_every_form_at_every_depth_is_masked(form: str, depth: int) -> None:
    masker = TextMasker({"ODD": ODD, "TOKEN": TOKEN})
    for value in (ODD, TOKEN):
        text = "<<" + "".join(spell(c, form, depth) for c in value) + ">>"
        assert masker.mask(text).count("<secret:") == 1, text


def test_json_and_repr_spellings_of_every_kind() -> None:
    masker = TextMasker({"ODD": ODD})
    texts = [json.dumps(ODD), json.dumps(ODD, ensure_ascii=False), repr(ODD), ascii(ODD),
             json.dumps(json.dumps({"c": ODD})), json.dumps(ODD).replace("/", "\\/").upper()]
    for text in texts[:-1]:
        assert "<secret:ODD>" in masker.mask(text), text
    assert masker.mask(texts[-1]) == texts[-1]  # upper-cased letters are another value


def test_whole_texts_equal_the_rule_without_shortcuts() -> None:
    rng = random.Random(11)
    masker, trouper_side = TextMasker(SECRETS), SecretMasker(SECRETS)
    for _ in range(1500):
        text = random_text(rng)
        expected = reference(masker, text)
        assert masker.mask(text) == expected, text
        assert trouper_side.mask_text(text) == expected, text


def test_too_many_anchors_falls_back_to_the_whole_text() -> None:
    masker = TextMasker({"TOKEN": TOKEN})
    text = "Zq5X" * 500 + spell("g", "u", 2) + TOKEN[1:] + "1" * 300 + TOKEN
    assert masker.mask(text) == reference(masker, text)
    assert masker.mask(text).count("<secret:TOKEN>") == 2


def test_masking_twice_equals_once_with_escapes() -> None:
    rng = random.Random(5)
    masker = TextMasker(SECRETS)
    for _ in range(300):
        once = masker.mask(random_text(rng))
        assert masker.mask(once) == once


def test_undecodable_bytes_stand_for_a_replacement_character() -> None:
    masker = TextMasker({"REPL": "r\ufffdpl-7Z"})
    for raw in (b"r\xffpl-7Z", b"r\xe2\x82pl-7Z", "r\ufffdpl-7Z".encode()):
        text = raw.decode("utf-8", "surrogateescape")
        assert masker.mask(text) == "<secret:REPL>", raw


def test_every_split_point_of_escaped_spellings(chunked) -> None:
    masker = TextMasker(SECRETS)
    text = (f"a {json.dumps(ODD)} b {json.dumps(ODD).replace('/', chr(92) + '/')} "
            + "".join(spell(c, "u", 2) for c in TOKEN) + " \\\\\\\\ "
            + json.dumps({"x": json.dumps(TOKEN + ODD)}) + " " + ODD + "<secret:TOKEN>"
            + "".join(spell(c, "U", 1) for c in "abcdef12") + "r\udcffpl-7Z\\")
    whole = masker.mask(text)
    assert whole == reference(masker, text) and whole.count("<secret:") == 9
    for cut in range(len(text) + 1):
        assert chunked(masker, text, [cut]) == whole, cut


def test_random_chunkings_of_escaped_text_equal_the_whole(chunked) -> None:
    rng = random.Random(3)
    masker = TextMasker(SECRETS)
    for _ in range(400):
        text = random_text(rng)
        cuts = [rng.randint(0, len(text)) for _ in range(rng.randint(0, 10))]
        assert chunked(masker, text, cuts) == masker.mask(text), (text, cuts)


def test_a_tail_that_could_still_become_an_escape_is_held() -> None:
    stream = StreamMasker(TextMasker({"TOKEN": TOKEN}))
    assert stream.feed("path C:\\") == "path C:" and stream.held_chars == 1
    assert stream.feed("x") == "" and stream.held_chars == 2  # \x67 would be a "g"
    assert stream.feed("yz\\u00") == "\\xyz" and stream.held_chars == 4
    assert stream.feed("41 done") == "\\u0041 done" and stream.held_chars == 0
    assert stream.feed("ghp_abc\\u006") == "" and stream.feed("4ef123456") == "<secret:TOKEN>"


@pytest.mark.timeout(60)  # a blowup of the spellings would take hours (no timed assert)
def test_a_long_value_is_masked_in_chunks_without_a_blowup(chunked) -> None:
    value = "".join(random.Random(2).choice('abcXYZ019"/\\é-') for _ in range(400))
    masker = TextMasker({"PEM": value})
    text = "x" + json.dumps(json.dumps(value)) + "y" + value[:-1]
    whole = masker.mask(text)
    assert whole.count("<secret:PEM>") == 1
    assert chunked(masker, text, list(range(0, len(text), 997))) == whole


@pytest.mark.timeout(30)  # linear: milliseconds; quadratic: hours (no timed assert)
def test_a_megabyte_of_escaped_json_is_masked_in_linear_time() -> None:
    rng = random.Random(1)
    lines = [json.dumps({"msg": " ".join(rng.choice(["ok", "a\\b", "x/y", '"q"', "é"])
                                         for _ in range(8))}) for _ in range(20_000)]
    text = "\n".join(lines + [json.dumps(ODD), TOKEN])
    masker = TextMasker({"ODD": ODD, "TOKEN": TOKEN, "OTHER": "other-value-9"})
    masked = masker.mask(text)
    assert masked.endswith('"<secret:ODD>"\n<secret:TOKEN>')


def test_windows_never_start_inside_a_placeholder() -> None:
    masker = TextMasker({"K": "secret-9", "SEC": "secret"})
    text = "<secret:K> <secret:SEC> \\u0073ecret"
    assert masker.mask(text) == reference(masker, text) == "<secret:K> <secret:SEC> <secret:SEC>"
    assert mask_module._MAX_SPOTS > 0


@pytest.mark.parametrize("secrets, text", [
    # a value that overlaps itself: its tail may start it again, inside a whole match
    ({"A": "QaQaQ"}, "\\n xQaQaQ QaQa\\u0051aQ QaQaQaQ"),
    # a value that starts like the end of a placeholder: the tail opens inside one
    ({"k": "kk-key-1", "V": "k>abcdQZ"}, "\\n <secret:k>abcdQZ <secret:k>ab\\u0063dQZ"),
])
def test_cuts_never_split_a_match_or_a_placeholder(secrets: dict[str, str], text: str,
                                                   chunked) -> None:
    masker = TextMasker(secrets)
    whole = masker.mask(text)
    assert whole == reference(masker, text)
    for cut in range(len(text) + 1):
        assert chunked(masker, text, [cut]) == whole, cut
    for size in (1, 2, 3):
        assert chunked(masker, text, list(range(0, len(text), size))) == whole, size


def test_a_placeholder_longer_than_a_window_is_kept_whole() -> None:
    long_name = "ABCD" + "x" * 100  # its placeholder holds the other value, far from its end
    masker = TextMasker({long_name: "first-value-1", "V": "ABCD"})
    text = f"\\n <secret:{long_name}>{' ' * 200}\\u0041BCD"
    assert masker.mask(text) == reference(masker, text)
    assert masker.mask(text) == f"\\n <secret:{long_name}>{' ' * 200}<secret:V>"


@pytest.mark.timeout(60)  # linear: a second or two; quadratic: hours (no timed assert)
def test_a_storm_of_backslashes_streams_in_linear_time(chunked) -> None:
    lead = "\\\\zq-9Q"  # starts with two backslashes: 48 in a row at depth 4
    masker = TextMasker({"ODD": ODD, "TOKEN": TOKEN, "LEAD": lead})
    spelled = "".join(spell(c, "short", 4) for c in ODD)  # runs of up to 31 backslashes
    # 100,000 in a row: quadratic work on them would not end within the timeout
    text = ("\\" * 100_000 + spelled + "\\" * 40 + "".join(spell(c, "u", 3) for c in TOKEN)
            + "\\" * 100 + "".join(spell(c, "short", 4) for c in lead) + "\\" * 100)
    masked = masker.mask(text)
    assert chunked(masker, text, list(range(0, len(text), 4096))) == masked
    assert masked == reference(masker, text)
    assert masked.count("<secret:") == 3  # a run takes at most 8 (depth 4)
    for size in (7, 13):  # every cut near the spellings
        tail = text[-3000:]
        assert chunked(masker, tail, list(range(0, len(tail), size))) == masker.mask(tail)
