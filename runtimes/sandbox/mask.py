"""Secret values out of text: ``TextMasker`` (``stream.StreamMasker`` for text in chunks).

Stdlib-only, so the sandbox server masks where output is produced; trouper's own
``masking.py`` masks text with this same code, so the two sides cannot drift apart. The
rule, for each value in turn, longest first (a secret that contains another is masked
whole):

- every spelling of the value becomes ``<secret:NAME>``: plain, and every escaped
  spelling of a JSON or Python string literal, in any mix and at any depth
  (``spelling.py`` says which);
- values shorter than ``MIN_SECRET_CHARS`` are ignored: masking ``"abc"`` everywhere would
  garble ordinary text and reveal, by the gaps, where the value appears;
- a value is also masked in every form text may have turned it into on its way
  (``forms``): each Unicode normal form, and for a value holding a lone surrogate, that
  surrogate as U+FFFD (what storable text holds), ``?`` (encoded with ``replace``) or gone;
- when two names share a value, the first name in sorted order is shown;
- placeholders of this masker's names already in the text are left alone, so masking
  twice equals masking once. Two secrets that overlap in the text (one's tail is the
  other's head) are masked in turn, so the shorter one's part outside the overlap stays.

Text is matched left to right as ``re.sub`` does: with a placeholder already there
taken whole where it starts. Text without a backslash can hold only plain spellings, and
text where no character of a value is escaped only its plain one: ``str`` methods mask
those, and the escape-aware regex runs only where an escape could spell the value.

    >>> masker = TextMasker({"API_KEY": "sk-12345"})
    >>> masker.mask('{"auth": "sk-1234", "raw": "sk-\\\\u00312345"}')
    '{"auth": "sk-1234", "raw": "<secret:API_KEY>"}'
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable, Mapping, Match, Pattern

from . import spelling

MIN_SECRET_CHARS = 4
"""Secret values shorter than this are not masked (see the module docstring)."""


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_NORMAL_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


def forms(value: str) -> list[str]:
    """``value`` and every other form text may hold it in once converted: each Unicode
    normal form and, where it holds lone surrogates, each with them as U+FFFD, ``?`` or
    dropped (the text was made storable, encoded with ``replace`` or with ``ignore``)."""
    bases = [value]
    if _LONE_SURROGATE.search(value):
        bases += [_LONE_SURROGATE.sub(s, value) for s in ("\ufffd", "?", "")]
    found = dict.fromkeys(bases)
    for base in bases:
        for form in _NORMAL_FORMS:
            if not unicodedata.is_normalized(form, base):
                found.setdefault(unicodedata.normalize(form, base))
    return list(found)


_MAX_SPOTS = 128
"""Past this many places where a value could be spelled, its regex runs over all the text."""


class Rule:
    """One value, its placeholder, and its regexes (compiled on first need: about 10 ms per
    100 characters of value, paid only where an escape could spell it)."""

    def __init__(self, value: str, name: str, placeholders: str, prefixes: list[str]) -> None:
        self.value = value
        self.placeholder = f"<secret:{name}>"
        self.template = self.placeholder.replace("\\", "\\\\")
        """The placeholder as an ``re.sub`` template."""
        self.plain_ok = "<" not in value and "\ufffd" not in value
        """True when text without a backslash can hold only the plain spelling, and no
        spelling can run into a placeholder: then ``str`` methods and splitting at
        placeholders do what the placeholder-aware regex would."""
        self.max_chars = spelling.max_chars(value)
        self.anchors = spelling.anchors(value)
        """Characters every spelling holds (plain or escaped), likeliest rare first."""
        self._placeholders = placeholders
        """The regex of a placeholder of the masker's names."""
        self._prefixes = prefixes
        """Every non-empty proper prefix of a placeholder of the masker's names."""
        self._compiled: dict[str, Pattern[str]] = {}

    @property
    def compiled(self) -> bool:
        """True once one of the rule's regexes was compiled."""
        return bool(self._compiled)

    def regex(self, kind: str) -> Pattern[str]:
        """``full`` (every spelling), ``chain`` (a placeholder already there, or a
        spelling), ``prefix`` (a tail that more text could make a spelling of, or a
        placeholder) or an anchor character (its escaped spellings)."""
        pattern = self._compiled.get(kind)
        if pattern is None:
            pattern = self._compiled[kind] = re.compile(self._source(kind))
        return pattern

    def _source(self, kind: str) -> str:
        if kind == "full":
            return spelling.value_pattern(self.value)
        if kind == "chain":
            return f"({self._placeholders})|{spelling.value_pattern(self.value)}"
        if kind == "prefix":
            partial = [re.escape(p) for p in self._prefixes]
            return "(?:" + "|".join([spelling.prefix_pattern(self.value), *partial]) + r")\Z"
        return spelling.escaped_pattern(kind)

    def windows(self, text: str, escaped: frozenset[str]) -> list[tuple[int, int]] | None:
        """Where in ``text`` a spelling of the value can be: ``(start, end)`` spans, sorted
        and apart, around each plain or escaped occurrence of an anchor character (every
        spelling holds one, and is no longer than ``max_chars``). ``escaped`` holds the
        anchors that may be escaped in ``text``. None when that is in too many places to
        be worth it: then anywhere."""
        for anchor in self.anchors:
            spots = self._spots(text, anchor, anchor in escaped)
            if spots is not None:
                return _merged([(p - self.max_chars, q + self.max_chars) for p, q in spots],
                               len(text))
        return None

    def _spots(self, text: str, anchor: str, escaped: bool) -> list[tuple[int, int]] | None:
        if text.count(anchor) > _MAX_SPOTS:
            return None
        spots = []
        pos = text.find(anchor)
        while pos >= 0:
            spots.append((pos, pos + 1))
            pos = text.find(anchor, pos + 1)
        if escaped:
            for match in self.regex(anchor).finditer(text):
                if len(spots) == _MAX_SPOTS:
                    return None
                spots.append(match.span())
        return spots


def _merged(spans: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """``spans`` clipped to ``[0, size]``, sorted, overlapping ones joined."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        start, end = max(0, start), min(size, end)
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


class TextMasker:
    """Replaces secret values, in every spelling, with ``<secret:NAME>`` in text.

    Args:
        secrets: secret name -> value. Values that are not strings, empty, or shorter
            than ``MIN_SECRET_CHARS`` are ignored.
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        names: dict[str, str] = {}
        originals: dict[str, str] = {}
        for name in sorted(secrets):
            value = secrets[name]
            if isinstance(value, str) and len(value) >= MIN_SECRET_CHARS:
                originals.setdefault(value, name)
        for value, name in list(originals.items()):
            for form in forms(value):
                if len(form) >= MIN_SECRET_CHARS:
                    names.setdefault(form, name)
        self._pairs = [(originals[v], v) for v in sorted(originals, key=lambda v: (-len(v), v))]
        shown = [f"<secret:{n}>" for n in sorted(set(names.values()))]
        source = "|".join(re.escape(p) for p in shown)
        self.placeholders = re.compile(f"({source})")
        """A placeholder of this masker's names (one group, for ``split``)."""
        self.placeholder_chars = max((len(p) for p in shown), default=0)
        """Characters in the longest placeholder of this masker."""
        prefixes = sorted({p[:k] for p in shown for k in range(1, len(p))},
                          key=lambda p: (-len(p), p))
        self.rules = [Rule(v, names[v], source, prefixes)
                      for v in sorted(names, key=lambda v: (-len(v), v))]
        """Longest value first."""
        self._anchors = sorted({a for rule in self.rules for a in rule.anchors})
        self._hex_built = False
        self._hex_anchors: Pattern[str] | None = None
        """Any hex escape of an anchor (None when one has a short escape); ``_groups``
        says the anchor of each of its groups."""
        self._groups: list[str] = []

    @property
    def enabled(self) -> bool:
        """True when there is at least one value to mask."""
        return bool(self.rules)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """``(name, value)`` of every value this masker was given, longest value first (not
        the other ``forms`` it masks them in)."""
        return list(self._pairs)

    def mask(self, text: str) -> str:
        """``text`` with every secret value replaced; ``text`` itself when none is in it."""
        escaped = self.escaped_anchors(text)  # masking adds no escape: it holds for all
        for rule in self.rules:
            text = self.apply(rule, text, escaped)
        return text

    def escaped_anchors(self, text: str) -> frozenset[str]:
        """The rules' anchor characters that may be escaped somewhere in ``text``."""
        if "\\" not in text or not self._anchors:
            return frozenset()
        regex = self._hex_regex()
        if regex is None:  # an anchor with a short escape: take it as there
            return frozenset(self._anchors)
        seen: set[str] = set()
        for n, match in enumerate(regex.finditer(text)):
            seen.add(self._groups[match.lastindex - 1])  # type: ignore[operator]
            if n == _MAX_SPOTS or len(seen) == len(self._anchors):
                return frozenset(self._anchors)
        return frozenset(seen)

    def _hex_regex(self) -> Pattern[str] | None:
        if not self._hex_built:
            found = spelling.hex_escapes(self._anchors)
            self._hex_anchors = re.compile(found[0]) if found else None
            self._groups = found[1] if found else []
            self._hex_built = True
        return self._hex_anchors

    def apply(self, rule: Rule, text: str, escaped: frozenset[str] | None = None) -> str:
        """``text`` with ``rule``'s value masked (placeholders already there kept);
        ``escaped`` is ``escaped_anchors(text)``, or a superset, when the caller knows it."""
        if rule.plain_ok and "\\" not in text:
            if rule.value not in text:
                return text
            return self._each_outside(text, lambda part: _replace(rule, part))
        return self.apply_in(rule, text, self.windows(rule, text, escaped))

    def windows(self, rule: Rule, text: str,
                escaped: frozenset[str] | None = None) -> list[tuple[int, int]] | None:
        """The spans of ``text`` where ``rule``'s value can be spelled (none starts or ends
        inside a placeholder); None when that is anywhere."""
        if not rule.plain_ok:
            return None
        windows = rule.windows(text, self.escaped_anchors(text) if escaped is None else escaped)
        return None if windows is None else self.spans(text, windows)

    def apply_in(self, rule: Rule, text: str, windows: list[tuple[int, int]] | None) -> str:
        """``text`` with ``rule``'s value masked inside ``windows`` (None: everywhere)."""
        if windows is None:
            return self._apply_regex(rule, text)
        pieces, last = [], 0
        for start, end in windows:
            pieces += [text[last:start], self._apply_regex(rule, text[start:end])]
            last = end
        masked = "".join(pieces) + text[last:]
        return text if masked == text else masked

    def spans(self, text: str, windows: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """``windows`` widened so that none starts or ends inside a placeholder."""
        if "<secret:" not in text:
            return windows
        widened = []
        for start, end in windows:
            around = self.placeholder_at(text, start)
            start = around.start() if around else start
            around = self.placeholder_at(text, end)
            widened.append((start, around.end() if around else end))
        return _merged(widened, len(text))

    def placeholder_at(self, text: str, pos: int) -> Match[str] | None:
        """The placeholder of this masker in ``text`` that ``pos`` is strictly inside."""
        reach = self.placeholder_chars
        for match in self.placeholders.finditer(text, max(0, pos - reach), pos + reach):
            if match.start() >= pos:
                break
            if pos < match.end():
                return match
        return None

    def _apply_regex(self, rule: Rule, text: str) -> str:
        if rule.plain_ok:
            full = rule.regex("full")
            return self._each_outside(text, lambda part: _same(part, full.sub(rule.template, part)))

        def one(match: Match[str]) -> str:
            return match.group(1) or rule.placeholder

        return _same(text, rule.regex("chain").sub(one, text))

    def _each_outside(self, text: str, fn: Callable[[str], str]) -> str:
        """``fn`` applied to each part of ``text`` outside this masker's placeholders."""
        if "<secret:" not in text:
            return fn(text)
        parts = self.placeholders.split(text)
        # split() with one group alternates: outside, placeholder, outside, ...
        outside = [fn(part) for part in parts[::2]]
        if all(new is old for new, old in zip(outside, parts[::2])):
            return text
        parts[::2] = outside
        return "".join(parts)


def _replace(rule: Rule, text: str) -> str:
    return text.replace(rule.value, rule.placeholder) if rule.value in text else text


def _same(old: str, new: str) -> str:
    """``old`` itself when ``new`` equals it (callers may test for identity)."""
    return old if new == old else new
