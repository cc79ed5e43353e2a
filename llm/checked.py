"""litellm's check of a history's messages, kept per history: each message checked once.

``validate_and_fix_openai_messages`` copies every message of the history on every call
(a third of the direct route's CPU at 200 steps). For a plain message (a role, text or
no content) what it makes depends on that message alone and it cannot refuse it. The
broker's next request for a session carries the same message dicts as its last plus a
few new ones (``llm/history.py``), so ``CheckedHistories`` keeps, for each history, the
dicts it checked and litellm's copy of each, and checks only the messages after them.

Kept per history, not per message: kept per message with a bound on messages, more
sessions than the bound held (300 of 300 messages) let each call evict what the next
session's call needed, and every call re-checked its whole history one message at a time
(1.25 ms a call, against 0.24 for litellm's check of the whole list). Here a history is
the unit: at most ``capacity`` of them (the broker's ``HistoryStore`` holds as many
sessions), and when they are all in use a new one is checked whole and not kept, rather
than pushing out one that is; a history nobody asked for in ``STALE_S`` makes room.
"""

from __future__ import annotations

import json
import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from litellm.utils import validate_and_fix_openai_messages

Message = dict[str, Any]

STALE_S = 600.0
"""A kept history unused this long may make room for a new one."""

_CACHE_CONTROL = '"cache_control"'
"""The key as JSON writes it; a string holding it is written with its quotes escaped."""


def mentions_cache_control(value: Any) -> bool:
    """Whether ``value`` may hold a ``cache_control`` key (True when unsure): one C-speed
    encoding instead of litellm's walk of every dict."""
    try:
        return _CACHE_CONTROL in json.dumps(value, check_circular=False)
    except (TypeError, ValueError):
        return True


def plain(message: Any) -> bool:
    """A message whose check depends on it alone: a role, and text or no content."""
    return (isinstance(message, dict) and bool(message.get("role"))
            and isinstance(message.get("content"), str | None))


@dataclass
class _History:
    sources: list[Message] = field(default_factory=list)
    """The dicts checked, in order (held, so their identities stay theirs)."""
    contents: list[Any] = field(default_factory=list)
    """Each one's content when checked: a message whose content changed is checked again."""
    checked: list[Message] = field(default_factory=list)
    """litellm's copy of each."""
    used_at: float = 0.0

    def common_prefix(self, messages: list[Message]) -> int:
        """How many leading ``messages`` are the dicts checked, their content unchanged."""
        n = min(len(self.sources), len(messages))
        if all(map(operator.is_, self.sources[:n], messages[:n])) and all(
                map(operator.is_, self.contents[:n], (m.get("content") for m in messages[:n]))):
            return n
        for i in range(n):
            if self.sources[i] is not messages[i] or self.contents[i] is not messages[i].get(
                    "content"):
                return i
        return n


class CheckedHistories:
    """litellm's checked copies of the messages of at most ``capacity`` histories."""

    def __init__(self, capacity: int = 1024, max_chars: int = 256 * 1024 * 1024,
                 clock: Callable[[], float] = time.monotonic,
                 check: Callable[[list[Message]], list[Message]] | None = None) -> None:
        self.capacity = capacity
        self.max_chars = max_chars
        """Content past which no new history is kept (a history the broker dropped stays
        alive here until it goes; one kept may grow past it)."""
        self._clock = clock
        self._check = check or validate_and_fix_openai_messages
        self._histories: OrderedDict[int, _History] = OrderedDict()
        """By the identity of the history's first dict, least recently used first."""
        self._chars = 0
        self._clean: dict[int, Message] = {}
        """The kept copies with no ``cache_control`` key (found once, when made)."""
        self._lock = threading.Lock()

    def __call__(self, messages: list[Message]) -> list[Message]:
        """litellm's checked copies of ``messages`` (a new list; the copies may be kept)."""
        if not messages or not all(plain(m) for m in messages):
            return self._check(messages)
        with self._lock:
            key = id(messages[0])  # a kept history holds its first dict: the id is its
            history = self._histories.get(key)
            if history is None:
                if not self._room_for(sum(len(m.get("content") or "") for m in messages)):
                    return self._check(messages)  # every kept history is in use
                history = self._histories[key] = _History()
            kept = history.common_prefix(messages)
            self._truncate(history, kept)
            for message in messages[kept:]:
                copy = self._check([message])[0]
                history.sources.append(message)
                history.contents.append(message.get("content"))
                history.checked.append(copy)
                self._chars += len(message.get("content") or "")
                if not mentions_cache_control(copy):
                    self._clean[id(copy)] = copy
            history.used_at = self._clock()
            self._histories.move_to_end(key)
            return list(history.checked)

    def known_clean(self, messages: list[Any]) -> bool:
        """Whether every one of ``messages`` is a kept copy known to hold no
        ``cache_control`` key."""
        with self._lock:
            return all(self._clean.get(id(m)) is m for m in messages)

    def forget(self, messages: list[Message]) -> None:
        """Let go of the checks kept for the history ``messages`` begins."""
        if messages:
            with self._lock:
                if id(messages[0]) in self._histories:
                    self._drop(id(messages[0]))

    def __len__(self) -> int:
        return len(self._histories)

    def _room_for(self, chars: int) -> bool:
        """Make room for one more history of ``chars``, letting go only of stale ones."""
        now = self._clock()
        while self._histories and (len(self._histories) >= self.capacity
                                   or self._chars + chars > self.max_chars):
            oldest_key, oldest = next(iter(self._histories.items()))
            if now - oldest.used_at < STALE_S:
                return False
            self._drop(oldest_key)
        return len(self._histories) < self.capacity and self._chars + chars <= self.max_chars

    def _truncate(self, history: _History, keep: int) -> None:
        """Forget what was checked after the first ``keep`` messages (the history changed)."""
        for copy, content in zip(history.checked[keep:], history.contents[keep:],
                                 strict=True):
            self._clean.pop(id(copy), None)
            self._chars -= len(content or "")
        del history.sources[keep:], history.contents[keep:], history.checked[keep:]

    def _drop(self, key: int) -> None:
        history = self._histories.pop(key)
        self._truncate(history, 0)
