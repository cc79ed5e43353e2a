"""Text that can always be stored: what a model or a command sends becomes valid UTF-8."""

from __future__ import annotations

import re
from typing import Any

LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""A code point UTF-8 cannot encode: JSON from a model may carry one (``"\\ud800"``)."""


def storable(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings replaced by U+FFFD (I6).

    Walks dicts, lists and tuples; returns the very object when nothing changed.
    """
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value) if LONE_SURROGATE.search(value) else value
    if isinstance(value, dict):
        items = {storable(k): storable(v) for k, v in value.items()}
        same = all(a is b for a, b in zip(items.values(), value.values(), strict=True))
        return value if same and len(items) == len(value) else items
    if isinstance(value, list | tuple):
        items = [storable(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else type(value)(items)
    return value
