"""A session's history crosses to the broker once: each request carries what is new.

A model request holds the whole conversation (and the tools), and a session sends one
per step: at 200 steps that is about 30 KB pickled, sent, and unpickled each time, for a
history that grew by two or three messages. ``HistorySender`` (the Controller's side)
remembers what it last sent and sends only the messages after it, naming the history
(``history_id``) and how long it already was (``history_len``); ``HistoryStore`` (the
broker's side) keeps each session's last whole request and rebuilds the next one. When
the store cannot (a restarted broker, an evicted session, requests that crossed), it
says so and the sender sends the request whole again (``ResendHistory``): a request is
always answered from the same messages the session's core built. A change anywhere but
at the end (a condensed prompt, new workspace instructions) is sent whole too.

Neither side imports litellm or Thespian.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..messages.protocol import Complete

Messages = list[dict[str, Any]]


@dataclass
class _Sent:
    history_id: str
    messages: Messages
    """A copy of the list last sent (the dicts are shared: the prompt never mutates them)."""
    tools: list[dict[str, Any]]
    chars: int = 0
    """The JSON length of ``messages`` and ``tools`` (the broker's side keeps it, for a
    token estimate that does not serialise the whole history again)."""


def _json_len(value: Any) -> int:
    return len(json.dumps(value, default=str, ensure_ascii=False))


def _list_len(items: list[Any]) -> int:
    """``len(json.dumps(items))`` from its items': brackets and ", " between them."""
    return 2 + sum(_json_len(item) for item in items) + 2 * max(0, len(items) - 1)


def request_chars(messages: Messages, tools: list[dict[str, Any]]) -> int:
    """What ``llm.gate.estimate_tokens`` counts: the JSON length of both (tools if any)."""
    return _list_len(messages) + (_list_len(tools) if tools else 0)


def _extends(sent: _Sent, messages: Messages, tools: list[dict[str, Any]]) -> bool:
    """Whether ``messages`` is what was sent plus messages at the end, with the same tools."""
    if len(messages) < len(sent.messages):
        return False
    if tools is not sent.tools and tools != sent.tools:
        return False
    return all(a is b or a == b for a, b in zip(sent.messages, messages, strict=False))


class HistorySender:
    """One Controller's side: what its broker already has of this session's history."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._count = 0
        self._sent: _Sent | None = None

    def forget(self) -> None:
        """The broker has nothing of ours (it restarted, or asked for the whole request)."""
        self._sent = None

    def prepare(self, request: Complete) -> Complete:
        """``request`` as it should go to the broker: whole, or only what is new."""
        sent = self._sent
        if sent is not None and _extends(sent, request.messages, request.tools):
            known = len(sent.messages)
            sent.messages = list(request.messages)
            return request.model_copy(update={
                "messages": request.messages[known:], "tools": [],
                "history_id": sent.history_id, "history_len": known})
        self._count += 1
        history_id = f"{self._prefix}-{self._count}"
        self._sent = _Sent(history_id, list(request.messages), request.tools)
        return request.model_copy(update={"history_id": history_id, "history_len": 0})


class HistoryStore:
    """The broker's side: each session's last whole request, the ``capacity`` most recent."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, _Sent] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def take(self, request: Complete) -> tuple[Complete, int] | None:
        """The whole request ``request`` stands for, kept for the session's next one, and
        its JSON length (``request_chars``: counted only for what is new); None when it
        builds on a history this store does not have (send it whole)."""
        if request.history_len == 0:
            chars = request_chars(request.messages, request.tools)
            if request.history_id:
                self._keep(request.session_id, _Sent(request.history_id, request.messages,
                                                     request.tools, chars))
            return request, chars
        kept = self._kept.get(request.session_id)
        if (kept is None or kept.history_id != request.history_id
                or len(kept.messages) != request.history_len):
            return None
        messages = kept.messages + request.messages
        added = sum(_json_len(m) for m in request.messages) + 2 * len(request.messages)
        if not kept.messages:  # no ", " before the first
            added -= 2 if request.messages else 0
        chars = kept.chars + added
        self._keep(request.session_id, _Sent(kept.history_id, messages, kept.tools, chars))
        whole = request.model_copy(update={"messages": messages, "tools": kept.tools,
                                           "history_len": 0})
        return whole, chars

    def forget(self, session_id: str) -> Messages:
        """Let go of the session's history; the messages it held (none if none)."""
        sent = self._kept.pop(session_id, None)
        return sent.messages if sent is not None else []

    def _keep(self, session_id: str, sent: _Sent) -> None:
        self._kept[session_id] = sent
        self._kept.move_to_end(session_id)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)
