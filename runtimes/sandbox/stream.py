"""Secret values out of text that arrives in chunks: ``StreamMasker``.

The concatenated results equal ``TextMasker.mask`` of the whole text, wherever the chunks
were cut: a secret split across reads, or an escape cut in half, is masked whole.

    >>> from .mask import TextMasker
    >>> stream = StreamMasker(TextMasker({"API_KEY": "sk-12345"}))
    >>> stream.feed("key sk-1") + stream.feed("2345 done") + stream.flush()
    'key <secret:API_KEY> done'
"""

from __future__ import annotations

from typing import Any

from . import spelling
from .mask import Rule, TextMasker


class StreamMasker:
    """Masks text that arrives in chunks: the concatenated results equal ``masker.mask``
    of the whole text, wherever the chunks were cut.

    One stage per value, in the masker's order, each a ``re.sub`` of its own over the text
    the stage before let through. A stage emits its text up to a cut and holds back the
    rest: the cut is before the tail that more text could turn into a spelling (or lengthen
    one, or complete a placeholder) and never inside a match, so its matches are the ones
    the whole text would have. ``flush`` returns what is held, masked, once no more comes.
    """

    def __init__(self, masker: TextMasker) -> None:
        self.masker = masker
        self._stages = [_Stage(masker, rule) for rule in masker.rules]

    @property
    def held_chars(self) -> int:
        """How many characters are held back, waiting for the next chunk."""
        return sum(stage.held_chars for stage in self._stages)

    def feed(self, chunk: str) -> str:
        """The masked text that is safe to emit after ``chunk`` arrived."""
        escaped = self.masker.escaped_anchors(chunk)
        for stage in self._stages:  # what a stage lets through comes from what it got
            chunk, escaped = stage.feed(chunk, escaped)
        return chunk

    def flush(self) -> str:
        """The masked text held back (call at the end of the stream)."""
        text = ""
        for stage in self._stages:
            text = stage.feed(text, None)[0] + stage.flush()
        return text


class _Stage:
    """One value's part of a ``StreamMasker``."""

    def __init__(self, masker: TextMasker, rule: Rule) -> None:
        self._masker = masker
        self._rule = rule
        self._reach = max(rule.max_chars, masker.placeholder_chars)
        """How far back from the end a tail that is still open can start."""
        self._plain_reach = max(len(rule.value), masker.placeholder_chars)
        """The same, in text without a backslash (no escape can be open there)."""
        self._storm = "\\" * (spelling.max_run(rule.value) + 1)
        """More backslashes in a row than a spelling holds: an open tail ending in them
        starts among the last of them."""
        self._held = ""
        self.held_escaped: frozenset[str] = frozenset()
        """Anchors that may be escaped in the held text."""

    @property
    def held_chars(self) -> int:
        return len(self._held)

    def feed(self, text: str, escaped: frozenset[str] | None) -> tuple[str, frozenset[str]]:
        """What this stage lets through of ``text``, and the anchors that may be escaped
        in it. ``escaped``: those that may be escaped in ``text`` (None: not known)."""
        if not text:
            return "", frozenset()
        buf = self._held + text
        masker, seam = self._masker, spelling.ESCAPE_CHARS - 1
        if escaped is None:
            escaped = masker.escaped_anchors(buf)
        else:  # masking adds no escape: those of the text, the held text, or across both
            seen = masker.escaped_anchors(self._held[-seam:] + text[:seam])
            escaped = escaped | self.held_escaped | seen
        cut, windows = self._cut(buf, escaped)
        self._held = buf[cut:]
        self.held_escaped = escaped if self._held else frozenset()
        if windows == "plain":
            return masker.apply(self._rule, buf[:cut]), escaped
        if windows is not None:  # still where the value can be, up to the cut
            windows = [(start, min(end, cut)) for start, end in windows if start < cut]
        return masker.apply_in(self._rule, buf[:cut], windows), escaped

    def flush(self) -> str:
        held, self._held, self.held_escaped = self._held, "", frozenset()
        return self._masker.apply(self._rule, held)

    def _cut(self, buf: str, escaped: frozenset[str]) -> tuple[int, Any]:
        """Where ``buf`` may be split (before any open tail, never inside a placeholder,
        and between two matches: each is inside one of the rule's windows, so only the
        window around the cut needs its matches found, from the window's start), and the
        windows (None: everywhere; ``"plain"``: no backslash, str methods do)."""
        plain = self._rule.plain_ok and "\\" not in buf
        lo = max(0, len(buf) - (self._plain_reach if plain else self._reach))
        if not plain and buf.endswith(self._storm):
            lo = len(buf) - len(self._storm) + 1
        tail = self._rule.regex("prefix").search(buf, lo)
        cut = tail.start() if tail is not None else len(buf)
        if plain:
            return self._plain_cut(buf, cut), "plain"
        around = self._masker.placeholder_at(buf, cut) if "<secret:" in buf else None
        cut = around.start() if around else cut
        windows = self._masker.windows(self._rule, buf, escaped)
        for start, end in [(0, len(buf))] if windows is None else windows:
            if start < cut < end:
                for match in self._rule.regex("chain").finditer(buf, start, end):
                    if match.start() >= cut:
                        break
                    if match.end() > cut:
                        return match.start(), windows
        return cut, windows

    def _plain_cut(self, buf: str, cut: int) -> int:
        """Without a backslash the matches are the value and placeholders: move the cut
        before any of them it would split."""
        value, size = self._rule.value, len(self._rule.value)
        moved = True
        while moved and cut > 0:
            start = buf.find(value, max(0, cut - size + 1), cut + size - 1)
            moved = 0 <= start < cut
            if moved:
                cut = start
            around = self._masker.placeholder_at(buf, cut) if "<secret:" in buf else None
            if around is not None:
                cut, moved = around.start(), True
        return cut
