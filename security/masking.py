"""Keeping secret values out of what trouper stores, shows, logs and prompts (I7 in
docs/promises.md).

Two sets, never one. What trouper *masks* is every value it must not leak: the user's
secrets and every credential it holds (the LLM API key, an operator's transport key
file). What the model may *use* is only the user's sandbox secrets: an action is revealed
(``<secret:NAME>`` turned back into the value) with a masker of those alone, so a model
that writes ``<secret:LLM_API_KEY>`` gets that text, never the key
(``session_maskers``).

The rule: every occurrence of each value is replaced by ``<secret:NAME>``, longest values
first (so a secret that contains another is masked whole). A value is found in plain
text and in every escaped spelling of a JSON or Python string literal: any character as
``\\uXXXX`` (either case of hex digits, surrogate pairs past U+FFFF), ``\\"``, ``\\\\``,
``\\/``, ``\\n``-style short escapes, and Python's ``\\'``, ``\\xHH`` and
``\\UXXXXXXXX``, in any mix and at any depth (JSON inside JSON: an event that stores raw
tool-call arguments, an error that quotes a request, an exception's repr). Values shorter
than ``MIN_SECRET_CHARS`` characters are ignored: masking ``"abc"`` everywhere would
garble ordinary text and reveal, by the gaps, where the value appears. Placeholders of
this masker's names already in the text are left alone, so masking twice equals masking
once. Two secrets that overlap in the text (one's tail is the other's head) are masked in
turn, longest first, so the shorter one's part outside the overlap stays visible.

There is one implementation of that rule: the sandbox's ``TextMasker``
(``runtimes/sandbox/mask.py`` and ``spelling.py``, stdlib-only, so the sandbox server masks
its journal and output files with it too). ``SecretMasker`` masks text with it, and adds
what only trouper needs: unique names for ``(name, value)`` pairs, pydantic models walked
field by field, and ``reveal``.

Each process also keeps a registry of every value it was told of (``remember_secrets``);
``mask_known`` masks with all of them, and the log record factory installed by the first
``remember_secrets`` masks every log record *where it is made*, before a handler or
Thespian's forwarder (which pickles the record to its logger process) sees it.

    >>> masker = SecretMasker({"API_KEY": "sk-12345"})
    >>> masker.mask_text("curl -H 'Authorization: sk-12345'")
    "curl -H 'Authorization: <secret:API_KEY>'"
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from ..runtimes.sandbox.mask import MIN_SECRET_CHARS, TextMasker
from .transport_key import TRANSPORT_KEY_FILE_ENV, read_key_file

if TYPE_CHECKING:
    from ..config.models import LLMConfig

__all__ = ["LLM_KEY_NAME", "MIN_SECRET_CHARS", "TRANSPORT_KEY_NAME", "SecretMasker",
           "credentials", "install_log_masking", "known_masker", "mask_known",
           "remember_secrets", "session_maskers"]

LLM_KEY_NAME = "LLM_API_KEY"
RUNTIME_TOKEN_NAME = "TROUPER_RUNTIME_TOKEN"
"""The placeholder name of a remote runtime's token (masked, never revealed)."""
"""The placeholder name of the session's LLM API key (masked, never revealed)."""
TRANSPORT_KEY_NAME = "TROUPER_TRANSPORT_KEY"
"""The placeholder name of an operator's actor-transport key (masked, never revealed)."""

T = TypeVar("T")

class SecretMasker:
    """Replaces secret values with ``<secret:NAME>`` in text and in pydantic models.

    Args:
        secrets: secret name -> value. Values that are empty or shorter than
            ``MIN_SECRET_CHARS`` are ignored; when two names share a value, the first
            name in sorted order is shown.
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self._build(sorted(secrets.items()))

    @classmethod
    def of_pairs(cls, pairs: Iterable[tuple[str, str]]) -> SecretMasker:
        """A masker of ``(name, value)`` pairs, in their order: a value seen again keeps
        its first name, and a name seen again with another value shows as ``NAME_2``
        (``_3``...), so every placeholder stands for one value."""
        masker = cls.__new__(cls)
        masker._build(pairs)
        return masker

    def _build(self, pairs: Iterable[tuple[str, str]]) -> None:
        names: dict[str, str] = {}
        """value -> its placeholder name."""
        taken: set[str] = set()
        for name, value in pairs:
            if len(value) < MIN_SECRET_CHARS or value in names:
                continue
            unique, n = name, 1
            while unique in taken:
                n += 1
                unique = f"{name}_{n}"
            names[value] = unique
            taken.add(unique)
        self._values = {name: value for value, name in names.items()}
        self._text = TextMasker(self._values)
        """The sandbox's masker (one name per value here): all of the text masking."""
        alternatives = "|".join(re.escape(name) for name in sorted(taken))
        self._placeholders = re.compile(f"(<secret:(?:{alternatives})>)")

    @property
    def enabled(self) -> bool:
        """True when there is at least one value to mask."""
        return self._text.enabled

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """``(name, value)`` of every value this masker masks, longest value first."""
        return self._text.pairs

    @property
    def names(self) -> frozenset[str]:
        """The placeholder names this masker shows (and ``reveal`` turns back)."""
        return frozenset(self._values)

    def mask_text(self, text: str) -> str:
        """``text`` with every secret value, in every spelling, replaced by its placeholder;
        ``text`` itself when none is in it."""
        return self._text.mask(text)

    def mask_event(self, event: T) -> T:
        """A copy of a pydantic event or message with every string inside it masked.

        Nested models, dicts (keys and values), lists, tuples and sets are walked; the
        input itself is returned when nothing in it holds a secret.
        """
        if not self.enabled:
            return event
        return self._mask(event, self.mask_text)

    def reveal_text(self, text: str) -> str:
        """``text`` with each ``<secret:NAME>`` of this masker replaced by the value."""
        if "<secret:" not in text or not self._values:
            return text
        return self._placeholders.sub(lambda m: self._values[m.group(1)[8:-1]], text)

    def reveal(self, message: T) -> T:
        """A copy of a model with its placeholders turned back into the secret values.

        The log and the prompt hold placeholders; an action is revealed just before it
        goes to the sandbox, so a model that writes ``<secret:NAME>`` uses the secret.
        Reveal only with a masker of the user's sandbox secrets (``session_maskers``).
        """
        if not self.enabled:
            return message
        return self._mask(message, self.reveal_text)

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


# ---- a session's two sets ------------------------------------------------------------


def credentials(llm: LLMConfig | None, runtime: object = None) -> dict[str, str]:
    """The credentials trouper holds for a session: masked everywhere, never revealed.

    The LLM API key (``fallbacks`` share it), a remote runtime's token and, when an
    operator gave one, the actor transport's key file's text. A random transport key is
    never written anywhere, so it cannot turn up in text.
    """
    found: dict[str, str] = {}
    if llm is not None and llm.api_key is not None:
        found[LLM_KEY_NAME] = llm.api_key.get_secret_value()
    token = getattr(runtime, "token", None)
    if token is not None:
        found[RUNTIME_TOKEN_NAME] = token.get_secret_value()
    key_text = _transport_key_text()
    if key_text:
        found[TRANSPORT_KEY_NAME] = key_text
    return found


def _transport_key_text() -> str:
    path = os.environ.get(TRANSPORT_KEY_FILE_ENV)
    if not path:
        return ""
    try:
        return read_key_file(Path(path)).decode("utf-8")
    except Exception:  # noqa: BLE001 - unreadable or binary: then no text can hold it
        return ""


def session_maskers(
    secrets: Mapping[str, str], llm: LLMConfig | None, runtime: object = None
) -> tuple[SecretMasker, SecretMasker]:
    """``(to_mask, to_reveal)`` for one session.

    ``to_mask`` holds the user's secrets and every credential; a credential whose value
    is also a user secret shows the user's name (so the model can use what the user gave
    it), and one whose name a user secret took shows as ``TROUPER_<name>``. ``to_reveal``
    holds the user's sandbox secrets only: the placeholders the model may use.
    """
    user = sorted(secrets.items())
    taken = set(secrets)
    held = [(f"TROUPER_{name}" if name in taken else name, value)
            for name, value in sorted(credentials(llm, runtime).items())]
    return SecretMasker.of_pairs([*user, *held]), SecretMasker(secrets)


# ---- the process's registry, and its log records ---------------------------------------

_known_pairs: dict[str, str] = {}
"""Every value this process was told of -> its name."""
_known = SecretMasker({})
_registry_lock = threading.Lock()
_installed: dict[str, Any] = {"previous": None}


def _after_fork_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()  # a lock held by another thread at fork stays held


os.register_at_fork(after_in_child=_after_fork_in_child)


def remember_secrets(secrets: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
    """Add ``secrets`` (name -> value, or ``(name, value)`` pairs) to what this process
    masks in its log records and in ``mask_known``; installs the log masking on first use.
    Values are never dropped: a value once known stays a secret for the process's life."""
    global _known
    items = sorted(secrets.items()) if isinstance(secrets, Mapping) else list(secrets)
    new = [(name, value) for name, value in items
           if len(value) >= MIN_SECRET_CHARS and value not in _known_pairs]
    if not new:
        return
    with _registry_lock:
        for name, value in new:
            _known_pairs.setdefault(value, name)
        _known = SecretMasker.of_pairs((n, v) for v, n in _known_pairs.items())
        # (a name two sessions share shows as NAME and NAME_2 in this process's logs)
    install_log_masking()


def known_masker() -> SecretMasker:
    """A masker of every value this process was told of."""
    return _known


def mask_known(text: str) -> str:
    """``text`` masked with every value this process was told of."""
    return _known.mask_text(text)


def install_log_masking() -> None:
    """Make every log record of this process masked where it is made. Idempotent.

    A record factory (not a filter) because filters on a logger miss its children's
    records, and handlers differ per process: in an actor process Thespian's forwarder
    pickles the record to its logger process, which knows none of this process's values.
    """
    with _registry_lock:
        if _installed["previous"] is not None:
            return
        _installed["previous"] = logging.getLogRecordFactory()
        logging.setLogRecordFactory(_masked_record)


def _masked_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record: logging.LogRecord = _installed["previous"](*args, **kwargs)
    masker = _known
    if masker.enabled:
        _mask_record(record, masker)
    return record


def _mask_record(record: logging.LogRecord, masker: SecretMasker) -> None:
    """Format the message now and mask it; the traceback text too (handlers use
    ``exc_text`` when it is set, Thespian's forwarder included)."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string still gets logged, masked
        message = f"{record.msg!s} {record.args!r}"
    record.msg, record.args = masker.mask_text(message), None
    if record.exc_info and not record.exc_text:
        record.exc_text = masker.mask_text(logging.Formatter().formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = masker.mask_text(record.stack_info)
