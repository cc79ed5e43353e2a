"""Keeping secret values out of what trouper stores, shows and prompts.

A session's secrets reach the sandbox as environment variables, so a command can echo
one; ``SecretMasker`` replaces each secret's value with ``<secret:NAME>`` wherever it
appears before the text is logged, published or sent to a model.

The rule: every occurrence of each value is replaced, longest values first (so a secret
that contains another is masked whole). A value is also found as it is spelled inside a
JSON string (quotes and backslashes escaped), as in a tool call's raw arguments. Values
shorter than ``MIN_SECRET_CHARS`` characters are ignored: masking ``"abc"`` or ``"1"``
everywhere would garble ordinary text and reveal, by the gaps, where the value appears.
Placeholders of this masker's names already in the text are left alone, so masking twice
equals masking once. Two secrets that overlap in the text (one's tail is the other's
head) are masked in turn, longest first, so the shorter one's part outside the overlap
stays visible.

    >>> masker = SecretMasker({"API_KEY": "sk-12345"})
    >>> masker.mask_text("curl -H 'Authorization: sk-12345'")
    "curl -H 'Authorization: <secret:API_KEY>'"
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

MIN_SECRET_CHARS = 4
"""Secret values shorter than this are not masked (see the module docstring)."""

T = TypeVar("T")


class SecretMasker:
    """Replaces secret values with ``<secret:NAME>`` in text and in pydantic models.

    Args:
        secrets: secret name -> value. Values that are empty or shorter than
            ``MIN_SECRET_CHARS`` are ignored; when two names share a value, the first
            name in sorted order is shown.
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        names: dict[str, str] = {}
        for name in sorted(secrets):
            value = secrets[name]
            if len(value) >= MIN_SECRET_CHARS:
                names.setdefault(value, name)
        variants = {v: name for value, name in names.items() for v in _spellings(value)}
        self._ordered = [
            (v, f"<secret:{variants[v]}>") for v in sorted(variants, key=len, reverse=True)
        ]
        """(value, placeholder), longest value first."""
        self._values = {name: value for value, name in names.items()}
        alternatives = "|".join(re.escape(name) for name in sorted(set(names.values())))
        self._placeholders = re.compile(f"(<secret:(?:{alternatives})>)")

    @property
    def enabled(self) -> bool:
        """True when there is at least one value to mask."""
        return bool(self._ordered)

    def mask_text(self, text: str) -> str:
        """``text`` with every secret value replaced by its placeholder."""
        for value, placeholder in self._ordered:
            if value in text:
                text = self._replace(text, value, placeholder)
        return text

    def mask_event(self, event: T) -> T:
        """A copy of a pydantic event or message with every string inside it masked.

        Nested models, dicts (keys and values), lists, tuples and sets are walked; the
        input itself is returned when nothing in it holds a secret.
        """
        if not self._ordered:
            return event
        return self._mask(event, self.mask_text)

    def reveal_text(self, text: str) -> str:
        """``text`` with each ``<secret:NAME>`` of this masker replaced by the value."""
        if "<secret:" not in text:
            return text
        return self._placeholders.sub(lambda m: self._values[m.group(1)[8:-1]], text)

    def reveal(self, message: T) -> T:
        """A copy of a model with its placeholders turned back into the secret values.

        The log and the prompt hold placeholders; an action is revealed just before it
        goes to the sandbox, so a model that writes ``<secret:NAME>`` uses the secret.
        """
        if not self._ordered:
            return message
        return self._mask(message, self.reveal_text)

    def _replace(self, text: str, value: str, placeholder: str) -> str:
        """Replace ``value`` everywhere except inside placeholders already there."""
        if "<secret:" not in text:
            return text.replace(value, placeholder)
        parts = self._placeholders.split(text)
        # split() with one group alternates: outside, placeholder, outside, ...
        parts[::2] = [part.replace(value, placeholder) for part in parts[::2]]
        return "".join(parts)

    def _mask(self, value: Any, fn: Callable[[str], str]) -> Any:
        if isinstance(value, str):
            return fn(value)
        if isinstance(value, BaseModel):
            return self._mask_model(value, fn)
        if isinstance(value, dict):
            return self._mask_dict(value, fn)
        if isinstance(value, list | tuple | set | frozenset):
            return self._mask_collection(value, fn)
        return value

    def _mask_model(self, model: BaseModel, fn: Callable[[str], str]) -> BaseModel:
        update = {}
        for name in type(model).model_fields:
            value = getattr(model, name)
            masked = self._mask(value, fn)
            if masked is not value:
                update[name] = masked
        return model.model_copy(update=update) if update else model

    def _mask_dict(self, value: dict[Any, Any], fn: Callable[[str], str]) -> dict[Any, Any]:
        masked = {self._mask(k, fn): self._mask(v, fn) for k, v in value.items()}
        changed = any(
            mk is not k or mv is not v
            for (k, v), (mk, mv) in zip(value.items(), masked.items(), strict=False)
        )
        return masked if changed or len(masked) != len(value) else value

    def _mask_collection(self, value: Any, fn: Callable[[str], str]) -> Any:
        items = [self._mask(item, fn) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        if isinstance(value, list):
            return items
        if hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        return type(value)(items)


def _spellings(value: str) -> set[str]:
    """The value, and how it reads inside a JSON string (raw tool-call arguments)."""
    escaped = {json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    return {value} | {v for v in escaped if len(v) >= MIN_SECRET_CHARS}
