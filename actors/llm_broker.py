"""LLMBroker: every model call of every session goes through this one actor.

Each call waits for its admission gate (one per API base, key and model: rpm, tpm and
concurrency shared by every session on the key, served round-robin), then runs on a
worker thread, so the broker keeps serving other sessions while one call waits on the
network. A failure that a retry can fix is tried again after a timer (``llm/backoff.py``:
exponential, full jitter above ``retry_min_wait_s``, ``Retry-After`` honoured, capped per
wait and in total); a 429 cools the whole gate down. Each retry is told to the caller as
``RetryScheduled`` so clients see it live. Spent retries on one model fall back to the
next of ``fallbacks``. A cancelled call's late answer and pending retry are dropped.

Time and randomness come in: the broker's clock (for its gates and timers) and random
source are constructor arguments, and the rate window comes from ``settings()``, read in
the broker's own process.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from thespian.actors import ActorAddress, ActorExitRequest

from ..config.settings import settings
from ..home.paths import Home
from ..llm import direct
from ..llm.backoff import Backoff
from ..llm.client import complete
from ..llm.credentials import auth_message, key_vars_in_use
from ..llm.errors import RETRYABLE, classify, response_headers, retry_after_s
from ..llm.gate import AdmissionGate, Clock, GateKey, GateLimits, GateRegistry, tokens_of
from ..llm.history import HistoryStore
from ..messages.protocol import (
    CancelCompletion,
    Complete,
    Completed,
    CompletionFailed,
    ResendHistory,
    RetryScheduled,
)
from ..messages.tree import BootBroker, ForgetHistory
from ..observability import tracing
from ..security.masking import LLM_KEY_NAME, SecretMasker, mask_known, remember_secrets
from .base import Timer, TrouperActor

logger = logging.getLogger(__name__)

ANSWERED_KEPT = 1024
"""How many answered request ids the broker remembers, to drop a late duplicate."""


@dataclass
class _Call:
    request: Complete
    reply_to: ActorAddress
    tokens: int
    """The request's estimated tokens (``llm.gate.tokens_of`` the JSON length the history
    store keeps as the history grows)."""
    attempt: int = 1
    """Attempts so far, over every model (numbers the LLMRetry events)."""
    tries_on_model: int = 1
    model_index: int = 0
    """0 for the configured model, then its ``fallbacks`` in order."""
    waited_s: float = 0.0
    gate: AdmissionGate | None = None
    span: Any = None
    """The call's span when the request carried a trace context (tracing on)."""

    @property
    def models(self) -> list[str]:
        return [self.request.llm.model, *self.request.llm.fallbacks]

    @property
    def model(self) -> str:
        return self.models[self.model_index]

    @property
    def key(self) -> GateKey:
        cfg = self.request.llm
        api_key = cfg.api_key.get_secret_value() if cfg.api_key else None
        return GateKey.of(self.model, cfg.base_url, api_key)


class LLMBroker(TrouperActor):
    role = "broker"
    max_workers = 512  # calls in flight are limited by the gates, not by threads

    def __init__(self, clock: Clock = time.monotonic, rng: random.Random | None = None) -> None:
        super().__init__()
        self._calls: dict[str, _Call] = {}
        self._clock = clock
        self._rng = rng or random.Random()
        timing = settings()
        self._gates = GateRegistry(clock, margin_s=timing.rate_window_margin_s,
                                   window_s=timing.rate_window_s)
        self._pump_due: dict[GateKey, float] = {}
        self._answered_ids: OrderedDict[str, None] = OrderedDict()
        """The last ``ANSWERED_KEPT`` request ids answered: a duplicate is not asked again."""
        self._histories = HistoryStore()
        """Each session's last whole request: the next brings only what is new."""

    def on_boot_broker(self, msg: BootBroker, sender: ActorAddress) -> None:
        self.set_parent(sender)
        self.publish_pid(Home.at(msg.home).actor_pid_path("broker"))

    def on_complete(self, msg: Complete, sender: ActorAddress) -> None:
        if msg.request_id in self._calls:
            return  # a re-sent request already in flight (e.g. after a Controller restart)
        if msg.request_id in self._answered_ids:  # a duplicate that raced its own answer
            self.drop(msg, "it was answered already; the model is not asked twice")
            return
        taken = self._histories.take(msg)
        if taken is None:  # built on a history this broker does not have
            self.send(sender, ResendHistory(request_id=msg.request_id,
                                            session_id=msg.session_id))
            return
        whole, chars = taken
        if msg.llm.api_key is not None:  # providers' errors may echo it: mask them, and logs
            remember_secrets({LLM_KEY_NAME: msg.llm.api_key.get_secret_value()})
        call = _Call(request=whole, reply_to=sender, tokens=tokens_of(chars),
                     span=tracing.model_call_began(msg))
        self._calls[msg.request_id] = call
        self._enqueue(call)

    def on_exit_request(self, msg: ActorExitRequest, sender: ActorAddress) -> None:
        tracing.flush_at_exit()  # now: once its parent hears it is gone, it may be killed

    def on_forget_history(self, msg: ForgetHistory, sender: ActorAddress) -> None:
        """A session stood down: its history (and litellm's checks of it) go."""
        direct.forget_checks(self._histories.forget(msg.session_id))

    def on_cancel_completion(self, msg: CancelCompletion, sender: ActorAddress) -> None:
        call = self._calls.pop(msg.request_id, None)
        if call is None:
            self.drop(msg, "no call in flight with that id")
            return
        tracing.model_call_failed(call.span, "cancelled")
        if call.gate is not None:
            call.gate.cancel(msg.request_id)
            self._pump(call.key)

    # -- admission ---------------------------------------------------------------

    def _enqueue(self, call: _Call) -> None:
        cfg = call.request.llm
        limits = GateLimits(rpm=cfg.rpm, tpm=cfg.tpm, max_concurrency=cfg.max_concurrency)
        call.gate = self._gates.gate(call.key, limits)
        if call.request.lift_cooldown and call.attempt == 1:
            call.gate.lift_cooldown()
        call.gate.request(call.request.request_id, call.request.session_id,
                          call.tokens + (cfg.max_output_tokens or 0))
        self._pump(call.key)

    def _pump(self, key: GateKey) -> None:
        """Start what the gate admits now; set one timer for when it can admit more."""
        gate = self._gates.gates().get(key)
        if gate is None:
            return
        for ticket in gate.admit():
            call = self._calls.get(ticket)
            if call is None:
                gate.cancel(ticket)
                continue
            self._attempt(call)
        wait_s = gate.next_admission_in_s()
        if wait_s is None:
            return
        due = self._clock() + wait_s
        if key in self._pump_due and self._pump_due[key] <= due:
            return  # an earlier timer will pump this gate
        self._pump_due[key] = due
        self.after(wait_s, "pump", key)

    def on_timer_pump(self, key: GateKey) -> None:
        self._pump_due.pop(key, None)
        self._pump(key)

    # -- calls ---------------------------------------------------------------------

    def _attempt(self, call: _Call) -> None:
        request, attempt, model = call.request, call.attempt, call.model
        self.background.submit(
            tracing.within(call.span, lambda: complete(request, model=model, attempts=attempt)),
            lambda result, error: self._answered(call, result, error),
        )

    def _answered(
        self, call: _Call, result: tuple[Completed, dict[str, str]] | None,
        error: BaseException | None,
    ) -> None:
        request_id = call.request.request_id
        key, gate = call.key, call.gate
        if gate is not None:
            tokens = None if result is None else (
                result[0].prompt_tokens + result[0].completion_tokens)
            gate.release(request_id, tokens)
            gate.observe_headers(result[1] if result is not None else response_headers(error))
        if self._calls.get(request_id) is call:  # else cancelled meanwhile
            if error is None and result is not None:
                del self._calls[request_id]
                self._answered_ids[request_id] = None
                while len(self._answered_ids) > ANSWERED_KEPT:
                    self._answered_ids.popitem(last=False)
                self.send(call.reply_to, result[0])
                tracing.model_call_answered(call.span, result[0])
            else:
                self._failed(call, error or RuntimeError("no answer"))
        self._pump(key)

    def _failed(self, call: _Call, error: BaseException) -> None:
        error_class = classify(error)
        text = (auth_message(error, call.request.llm, call.model) if error_class == "auth"
                else f"{type(error).__name__}: {error}")
        message = _masked(call, text)
        cfg = call.request.llm
        backoff = Backoff.of(cfg, self._rng)
        wait_s = backoff.wait_s(call.tries_on_model, retry_after_s(error))
        if error_class == "rate_limit" and call.gate is not None:
            call.gate.cooldown(wait_s)  # every session on this key waits, not just this one
        if (
            error_class in RETRYABLE
            and call.tries_on_model <= cfg.num_retries
            and backoff.within_budget(call.waited_s, wait_s)
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
        failed = CompletionFailed(
            request_id=call.request.request_id, session_id=call.request.session_id,
            error_class=error_class, message=message,
            retry_after_s=retry_after_s(error), attempts=call.attempt)
        self.send(call.reply_to, failed)
        tracing.model_call_failed(call.span, failed)

    def _schedule_retry(self, call: _Call, error_class: str, message: str, wait_s: float) -> None:
        call.attempt += 1
        call.tries_on_model += 1
        call.waited_s += wait_s
        cfg = call.request.llm
        retry = RetryScheduled(
            request_id=call.request.request_id, session_id=call.request.session_id,
            model=call.model, attempt=call.attempt,
            max_attempts=(cfg.num_retries + 1) * len(call.models), wait_s=wait_s,
            error_class=error_class, message=message)  # type: ignore[arg-type]
        self.send(call.reply_to, retry)
        tracing.model_call_retried(call.span, retry)
        self.after(wait_s, "retry", call.request.request_id)

    def on_timer_retry(self, request_id: str) -> None:
        call = self._calls.get(request_id)
        if call is None:
            self.drop(Timer("retry", request_id), "its call was cancelled during the backoff")
        else:
            self._enqueue(call)


def _masked(call: _Call, text: str) -> str:
    """A provider's error text without the key (it may echo it): the call's own key shows
    as ``<secret:LLM_API_KEY>``, a key read from the environment as ``<secret:ITS_NAME>``,
    whatever else this process knows as itself."""
    key = call.request.llm.api_key
    keys = ({LLM_KEY_NAME: key.get_secret_value()} if key is not None
            else key_vars_in_use(call.model))
    if keys:
        text = SecretMasker(keys).mask_text(text)
    return mask_known(text)
