"""Every way a secret value can be spelled in text, as regular expressions.

A value is found in plain text and in every escaped spelling of a JSON or Python string
literal: any character as ``\\uXXXX`` (either case of hex digits, surrogate pairs past
U+FFFF), ``\\"``, ``\\\\``, ``\\/``, ``\\n``-style short escapes, and Python's ``\\'``,
``\\xHH`` and ``\\UXXXXXXXX``, in any mix and at any depth (JSON inside JSON: an event that
stores raw tool-call arguments, an error that quotes a request, an exception's repr). A
U+FFFD in a value also stands for one to three undecodable bytes (kept as surrogate
escapes, U+DC80..U+DCFF): that is how those bytes read once decoded with ``replace``.

Escaping is recognised to a depth of 4 strings in strings. Bounded, so a long run of
backslashes costs a constant per position, never a backtracking search.

Each character's pattern starts with a literal (a backslash, or the character itself), so
``re`` scans for a value's first character instead of trying every position. Stdlib-only,
Python >= 3.8: the sandbox runs this under ``python -I -S``.
"""

from __future__ import annotations

import re

_RUN = r"\\{0,7}"
"""The backslashes after the first one of an escape at depth 1 to 4 (1, 2, 4, 8 in all)."""
_PAIRS = r"(?:\\\\){0,7}"
"""Pairs of backslashes after the first one: an odd run, what escapes a quote at depth 4."""
_RUN_15 = r"\\{0,15}"
"""After a first backslash, the rest of any run an escape can start with."""
_LETTERS = {"\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
"""The one-letter escapes of JSON and Python (besides the quote, slash and backslash)."""
_UNDECODABLE = r"[\udc80-\udcff]{1,3}"
"""Undecodable bytes as ``surrogateescape`` keeps them: what U+FFFD stands for."""
ESCAPE_CHARS = 34
"""The longest escape of one character (16 backslashes, then a surrogate pair)."""
_BLOCK = 48
"""Characters per level of nesting in ``prefix_pattern`` (``re`` nests only so deep)."""


def _hex_atoms(prefix: str, code: int, digits: int) -> list[str]:
    """``prefix`` and the hex digits of ``code``, one regex per character, either case."""
    text = f"{code:0{digits}x}"
    return [prefix] + [f"[{d}{d.upper()}]" if d.isalpha() else d for d in text]


def _hex_forms(char: str) -> list[list[str]]:
    """The hex escapes of ``char``, after the backslashes, as lists of atoms."""
    code = ord(char)
    if code > 0xFFFF:
        high = 0xD800 + ((code - 0x10000) >> 10)
        low = 0xDC00 + ((code - 0x10000) & 0x3FF)
        pair = _hex_atoms("u", high, 4) + [r"\\{1,8}"] + _hex_atoms("u", low, 4)
        forms = [pair]
    else:
        forms = [_hex_atoms("u", code, 4)]
    if code < 0x100:
        forms.append(_hex_atoms("x", code, 2))
    return [*forms, _hex_atoms("U", code, 8)]


def escape_body(char: str) -> str:
    """What follows the first backslash of any escaped spelling of ``char``; the short
    escape comes first, so an escaped backslash is taken whole, never split in two."""
    hexes = "|".join("".join(form) for form in _hex_forms(char))
    if char in "\"'/":  # an odd run of backslashes, 1 to 15
        return _PAIRS + re.escape(char) + f"|{_RUN}(?:{hexes})"
    if char == "\\":  # an even run, 2 to 16
        return r"\\" + _PAIRS + f"|{_RUN}(?:{hexes})"
    if char in _LETTERS:
        return f"{_RUN}(?:{_LETTERS[char]}|{hexes})"
    return f"{_RUN}(?:{hexes})"


def _literal(char: str) -> str:
    return f"(?:\ufffd|{_UNDECODABLE})" if char == "\ufffd" else re.escape(char)


def char_pattern(char: str) -> str:
    """Every spelling of one character, escapes first."""
    return rf"(?:\\(?:{escape_body(char)})|{_literal(char)})"


def value_pattern(value: str) -> str:
    """Every spelling of ``value``."""
    return "".join(char_pattern(c) for c in value)


def anchors(value: str) -> list[str]:
    """Characters of ``value`` to look for first, likeliest to be rare in output first:
    every spelling of the value holds each of them, plain or escaped."""
    return sorted(set(value), key=lambda c: (_rarity(c), c))[:2]


def _rarity(char: str) -> int:
    if char in "\"'/\\<\ufffd" or char.isspace():  # escaped all the time in JSON
        return 6
    if "A" <= char <= "Z":
        return 0
    if "0" <= char <= "9":
        return 1
    if char in "jqxzkvwyfgbp" or not char.isascii():
        return 2
    return 3 if char.isalpha() else 4


def hex_escapes(chars: list[str]) -> tuple[str, list[str]] | None:
    """A regex found in every hex escape of any of ``chars``: the last backslash of its
    run, its letter and hex digits, one group per escape form; and the character each
    group stands for. None when one of them has a short escape (a quote, a slash, a
    backslash, ``\\n``...). One backslash, then one letter: a run of backslashes, or a
    backslash before anything else, costs one look at the next character."""
    if any(c in "\"'/\\" or c in _LETTERS for c in chars):
        return None
    by_letter: dict[str, list[tuple[str, str]]] = {}
    for char in chars:
        for form in _hex_forms(char):
            by_letter.setdefault(form[0], []).append(("".join(form[1:]), char))
    branches, groups = [], []
    for letter, forms in sorted(by_letter.items()):
        rests = "|".join(f"({rest})" for rest, _ in forms)
        branches.append(f"{letter}(?:{rests})")
        groups += [char for _, char in forms]
    return r"\\(?:" + "|".join(branches) + ")", groups


def escaped_pattern(char: str) -> str:
    """A regex found in every escaped spelling of ``char``."""
    found = hex_escapes([char])
    return found[0] if found else rf"\\(?:{escape_body(char)})"


def max_chars(value: str) -> int:
    """The length of the longest spelling of ``value``."""
    return sum(26 if ord(c) > 0xFFFF else 17 for c in value)  # \\{8}u..\\{8}u.. / \\{8}U..


def max_run(value: str) -> int:
    """The most backslashes in a row any spelling of ``value`` holds."""
    backslashes = max((len(run) for run in re.findall(r"\\+", value)), default=0)
    return 16 * (backslashes + 1)


def _nested(atoms: list[str]) -> str:
    """``a1(?:a2(?:a3)?)?``: the non-empty prefixes of the sequence ``atoms``."""
    pattern = atoms[-1]
    for atom in reversed(atoms[:-1]):
        pattern = f"{atom}(?:{pattern})?"
    return pattern


def _partial_body(char: str) -> str:
    """After the first backslash: what can begin an escape of ``char`` without ending it,
    and what more text could lengthen (a run of backslashes)."""
    heads = [_nested(form[:-1]) for form in _hex_forms(char)]
    return _RUN_15 + "(?:" + "|".join(heads) + ")?"


def prefix_pattern(value: str) -> str:
    """The texts that more text could turn into a spelling of ``value``, or into a longer
    one: a non-empty proper prefix of a spelling, or a spelling whose last backslashes
    could grow. Nested a block at a time, so a long value nests only so deep; every
    alternative at the top starts with a literal, so a search skips other characters."""
    blocks = [value[i:i + _BLOCK] for i in range(0, len(value), _BLOCK)]
    pattern = ""
    for n in range(len(blocks) - 1, -1, -1):
        block, top = blocks[n], n == 0
        local = _block_prefix(block, top)
        if pattern:
            rest = f"{value_pattern(block[1:])}(?:{pattern})?"
            whole = _split_first(block[0], rest) if top else char_pattern(block[0]) + rest
            pattern = f"{local}|{whole}"
        else:
            pattern = local
    return pattern


def _split_first(char: str, rest: str) -> str:
    """``char_pattern(char) + rest`` as two alternatives that each start with a literal."""
    return rf"\\(?:{escape_body(char)}){rest}|{_literal(char)}{rest}"


def _block_prefix(block: str, top: bool) -> str:
    """The prefixes of ``block``'s spellings that end inside it (each level nests the next
    once, so the pattern grows linearly with the block)."""
    pattern = ""
    for i in range(len(block) - 1, -1, -1):
        char = block[i]
        alternatives = [r"\\" + _partial_body(char)]
        if char == "\ufffd":
            alternatives.append(_UNDECODABLE)
        if pattern:  # a whole spelling of this character, then maybe a prefix of the rest
            rest = f"(?:{pattern})?"
            whole = _split_first(char, rest) if top and i == 0 else char_pattern(char) + rest
            alternatives.append(whole)
        pattern = "|".join(alternatives)
    return pattern
