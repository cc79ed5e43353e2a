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

    def take(self, request: Complete) -> Complete | None:
        """The whole request ``request`` stands for, kept for the session's next one; None
        when it builds on a history this store does not have (send it whole)."""
        if request.history_len == 0:
            if request.history_id:
                self._keep(request.session_id,
                           _Sent(request.history_id, request.messages, request.tools))
            return request
        kept = self._kept.get(request.session_id)
        if (kept is None or kept.history_id != request.history_id
                or len(kept.messages) != request.history_len):
            return None
        messages = kept.messages + request.messages
        self._keep(request.session_id, _Sent(kept.history_id, messages, kept.tools))
        return request.model_copy(update={"messages": messages, "tools": kept.tools,
                                          "history_len": 0})

    def _keep(self, session_id: str, sent: _Sent) -> None:
        self._kept[session_id] = sent
        self._kept.move_to_end(session_id)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)
