"""LLMBroker: every model call of every session goes through this one actor.

Calls run on worker threads, so the broker keeps serving other sessions while one call
waits on the network. A failed call that a retry can fix is tried again after a timer
(exponential backoff with full jitter, ``Retry-After`` honoured, capped per wait and in
total); each retry is told to the caller as ``RetryScheduled`` so clients see it live.
A cancelled call's late answer and pending retry are dropped.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from thespian.actors import ActorAddress

from ..llm.client import complete
from ..llm.errors import RETRYABLE, classify, retry_after_s
from ..messages.protocol import (
    CancelCompletion,
    Complete,
    Completed,
    CompletionFailed,
    RetryScheduled,
)
from ..paths import Home
from .base import TrouperActor
from .wiring import BootBroker

logger = logging.getLogger(__name__)


@dataclass
class _Call:
    request: Complete
    reply_to: ActorAddress
    attempt: int = 1
    """Attempts so far, over every model (numbers the LLMRetry events)."""
    tries_on_model: int = 1
    model_index: int = 0
    """0 for the configured model, then its ``fallbacks`` in order."""
    waited_s: float = 0.0

    @property
    def models(self) -> list[str]:
        return [self.request.llm.model, *self.request.llm.fallbacks]

    @property
    def model(self) -> str:
        return self.models[self.model_index]


class LLMBroker(TrouperActor):
    role = "broker"

    def __init__(self) -> None:
        super().__init__()
        self._calls: dict[str, _Call] = {}
        self._rng = random.Random()

    def on_boot_broker(self, msg: BootBroker, sender: ActorAddress) -> None:
        self.set_parent(sender)
        self.publish_pid(Home.at(msg.home).actor_pid_path("broker"))

    def on_complete(self, msg: Complete, sender: ActorAddress) -> None:
        if msg.request_id in self._calls:
            return  # a re-sent request already in flight (e.g. after a Controller restart)
        call = _Call(request=msg, reply_to=sender)
        self._calls[msg.request_id] = call
        self._attempt(call)

    def on_cancel_completion(self, msg: CancelCompletion, sender: ActorAddress) -> None:
        self._calls.pop(msg.request_id, None)

    def _attempt(self, call: _Call) -> None:
        request, attempt, model = call.request, call.attempt, call.model
        self.background.submit(
            lambda: complete(request, model=model, attempts=attempt),
            lambda result, error: self._answered(request.request_id, result, error),
        )

    def _answered(
        self, request_id: str, result: Completed | None, error: BaseException | None
    ) -> None:
        call = self._calls.get(request_id)
        if call is None:
            return  # cancelled meanwhile
        if error is None and result is not None:
            del self._calls[request_id]
            self.send(call.reply_to, result)
            return
        assert error is not None
        self._failed(call, error)

    def _failed(self, call: _Call, error: BaseException) -> None:
        error_class = classify(error)
        message = f"{type(error).__name__}: {error}"
        cfg = call.request.llm
        wait_s = self._wait_s(call, error)
        if (
            error_class in RETRYABLE
            and call.tries_on_model <= cfg.num_retries
            and call.waited_s + wait_s <= cfg.retry_total_s
        ):
            self._schedule_retry(call, error_class, message, wait_s)
            return
        if error_class in RETRYABLE and call.model_index + 1 < len(call.models):
            call.model_index += 1
            call.tries_on_model = 0
            self._schedule_retry(call, error_class, f"falling back to {call.model} after "
                                 f"{call.models[call.model_index - 1]} failed: {message}", 0.0)
            return
        del self._calls[call.request.request_id]
        self.send(call.reply_to, CompletionFailed(
            request_id=call.request.request_id, session_id=call.request.session_id,
            error_class=error_class, message=message,
            retry_after_s=retry_after_s(error), attempts=call.attempt))

    def _wait_s(self, call: _Call, error: BaseException) -> float:
        cfg = call.request.llm
        asked = retry_after_s(error)
        if asked is not None:
            return min(asked, cfg.retry_max_wait_s)
        ceiling = min(cfg.retry_max_wait_s, cfg.retry_min_wait_s * 2 ** (call.attempt - 1))
        return self._rng.uniform(min(cfg.retry_min_wait_s, ceiling), ceiling)

    def _schedule_retry(self, call: _Call, error_class: str, message: str, wait_s: float) -> None:
        call.attempt += 1
        call.tries_on_model += 1
        call.waited_s += wait_s
        cfg = call.request.llm
        self.send(call.reply_to, RetryScheduled(
            request_id=call.request.request_id, session_id=call.request.session_id,
            model=call.model, attempt=call.attempt,
            max_attempts=(cfg.num_retries + 1) * len(call.models), wait_s=wait_s,
            error_class=error_class, message=message))  # type: ignore[arg-type]
        self.after(wait_s, "retry", call.request.request_id)

    def on_timer_retry(self, request_id: str) -> None:
        call = self._calls.get(request_id)
        if call is not None:
            self._attempt(call)
