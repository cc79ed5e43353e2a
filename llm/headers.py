"""Numbers in providers' rate-limit headers: durations (``6m0s``) and counts."""

from __future__ import annotations

import re

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")
_DURATION = re.compile(rf"(?:{_DURATION_PART.pattern})+")
_PLAIN_SECONDS = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration_s(text: str) -> float | None:
    """Seconds in a rate-limit reset header: ``"6m0s"`` -> 360.0, ``"20ms"`` -> 0.02,
    ``"1.5"`` -> 1.5; ``None`` for anything else (empty, negative, junk)."""
    text = text.strip()
    if _PLAIN_SECONDS.fullmatch(text):
        return float(text)
    if not _DURATION.fullmatch(text):
        return None
    return sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION_PART.findall(text))


def parse_count(text: str | None, minimum: int) -> int | None:
    """A whole number of at least ``minimum`` from a header value, or None."""
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    if not value.is_integer() or value < minimum:
        return None
    return int(value)
