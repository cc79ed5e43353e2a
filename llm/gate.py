"""The shared admission gate: when may the next model call on one key start?

One gate exists per (api base, API key, model), shared by every session on that key. It is
pure, synchronous bookkeeping: no threads, no sleeping, no I/O. The LLMBroker asks it what may
start *now* (``admit``) and when to ask again (``next_admission_in_s``, one timer, no polling).
An injected clock makes every rule testable instantly.

The window is ``window_s`` long: ``Settings.rate_window_s``, 60 s unless overridden (a
test may compress it to match a fake server's). Limits (any may be ``None``, meaning no
limit):

- ``rpm``: a ticket is admitted only if fewer than ``rpm`` tickets were admitted in the last
  window (a sliding window over admission times, as providers enforce it). An admission at
  ``t`` counts while ``now < t + window_s + margin_s``: the margin covers the time a call
  takes to reach the provider after its admission.
- ``tpm``: the tokens admitted in the last window plus the ticket's estimate must be at most
  ``tpm``. Estimates are corrected to the actual count on ``release``. A ticket larger than
  ``tpm`` on its own is admitted once the window holds no tokens, rather than never.
- ``max_concurrency``: tickets admitted and not yet released (or cancelled).
- cooldown: after a 429 (or headers saying nothing is left), nothing is admitted until it ends.

Cold start: until a call through the gate has been answered, that time to reach the
provider has no bound. A fresh broker's first calls wait for litellm to import and build
its clients, seconds under load (seen here: calls admitted 2.4 s before they arrived, and
a 429 from a server counting its own window). So a call admitted while the gate is
*cold* counts until it ends and then for a whole window (it cannot have arrived after
its answer), not from its admission. The first answer makes the gate warm for good.

Fairness: queued tickets are served **round-robin across sessions, FIFO within a session**.
Sessions with queued tickets stand in a ring; each admission serves the session at the head
of the ring, which then goes to the back (behind every other waiting session, including one
that just arrived). So a session waiting behind N others is served within N admissions, however
many calls they have queued. The next ticket in that order is never overtaken: when it does
not fit (say a large estimate under ``tpm``), nothing behind it starts either, so a large
call cannot be starved by a stream of small ones.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..config.settings import settings
from .headers import parse_count, parse_duration_s

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class GateKey:
    """What a rate limit belongs to: one API base, one API key, one model."""

    api_base: str
    """The API base without a trailing slash; ``""`` for the provider's default."""
    key_id: str
    """A short hash of the API key (never the key itself); ``""`` when no key is given."""
    model: str

    @classmethod
    def of(cls, model: str, api_base: str | None, api_key: str | None) -> GateKey:
        """The key for a call to ``model`` at ``api_base`` with ``api_key``."""
        key_id = hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key else ""
        return cls(api_base=(api_base or "").rstrip("/"), key_id=key_id, model=model)


class GateLimits(BaseModel):
    """Limits on one key; ``None`` means no limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rpm: int | None = Field(default=None, ge=1)
    """Requests admitted in any sliding window (a minute unless the settings say else)."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens (estimated, then corrected) admitted in any sliding window."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Calls admitted and not yet released."""

    def strictest(self, other: GateLimits) -> GateLimits:
        """The smaller non-None value of each field."""
        merged = {name: _min_or_none(getattr(self, name), getattr(other, name)) for name in _FIELDS}
        return GateLimits(**merged)


_FIELDS = ("rpm", "tpm", "max_concurrency")


def _min_or_none(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


@dataclass
class _Queued:
    ticket: str
    session_id: str
    est_tokens: int


@dataclass(eq=False)  # a retry re-admits the same ticket: entries are told apart by identity
class _Admission:
    """One admitted ticket: a window entry until ``expires_at``."""

    ticket: str
    session_id: str
    admitted_at: float
    expires_at: float
    """Clock time at which it leaves the window: admission + window + margin; for a call
    admitted cold, ``math.inf`` until it ends, then at least its end + window."""
    tokens: int
    in_window: bool = True


def _expiry(entry: _Admission) -> float:
    return entry.expires_at


class AdmissionGate:
    """Decides which queued calls on one key may start now; see the module docstring."""

    def __init__(
        self,
        limits: GateLimits,
        clock: Clock = time.monotonic,
        name: str = "",
        margin_s: float = 0.0,
        window_s: float | None = None,
        warm: bool = False,
    ) -> None:
        """``window_s`` defaults to ``settings().rate_window_s``. ``warm`` says calls reach
        the provider within ``margin_s`` of admission from the start (tests of the window
        alone); the broker's gates start cold (see the module docstring)."""
        self._clock = clock
        self._margin_s = margin_s
        """Extra time an admission counts in the window: a request reaches the provider a
        little after its admission, and must not land in the provider's next window."""
        self._window_s = settings().rate_window_s if window_s is None else window_s
        self._name = name
        self._config = limits
        self._learnt = GateLimits()
        self._queues: OrderedDict[str, deque[_Queued]] = OrderedDict()
        self._queued: dict[str, _Queued] = {}
        self._in_flight: dict[str, _Admission] = {}
        self._window: list[_Admission] = []
        """Entries in the window, sorted by ``expires_at``."""
        self._warm = warm
        self._window_tokens = 0
        self._cooldown_until: float | None = None

    @property
    def limits(self) -> GateLimits:
        """The effective limits: config merged with what headers taught, strictest wins."""
        return self._config.strictest(self._learnt)

    def configure(self, limits: GateLimits) -> None:
        """Merge a session's configured limits; the strictest non-None value of each wins."""
        self._config = self._config.strictest(limits)

    def request(self, ticket: str, session_id: str, est_tokens: int) -> None:
        """Queue ``ticket``; a ticket already queued or in flight is left as it is."""
        if ticket in self._queued or ticket in self._in_flight:
            return
        item = _Queued(ticket, session_id, max(0, est_tokens))
        self._queued[ticket] = item
        self._queues.setdefault(session_id, deque()).append(item)

    def cancel(self, ticket: str) -> None:
        """Drop a queued ticket, or release an admitted one (its estimate stays counted)."""
        item = self._queued.pop(ticket, None)
        if item is None:
            self.release(ticket)
            return
        queue = self._queues[item.session_id]
        queue.remove(item)
        if not queue:
            del self._queues[item.session_id]

    def admit(self) -> list[str]:
        """The tickets that may start now, in fair order; their admission is recorded."""
        now = self._clock()
        self._prune(now)
        admitted: list[str] = []
        while self._queues and self._wait_s(self._head().est_tokens, now) == 0.0:
            admitted.append(self._admit_head(now))
        return admitted

    def next_admission_in_s(self) -> float | None:
        """Seconds until ``admit`` could admit the next queued ticket; 0.0 when it can now.

        ``None`` when nothing is queued, or when only a release can unblock it (a freed
        concurrency slot, or the end of a call admitted cold).
        """
        if not self._queues:
            return None
        now = self._clock()
        self._prune(now)
        return self._wait_s(self._head().est_tokens, now)

    def release(self, ticket: str, actual_tokens: int | None = None) -> None:
        """The call ended: free its slot and correct its tokens to ``actual_tokens``.

        ``actual_tokens`` given means the provider answered, which makes the gate warm;
        ``None`` (an error, a cancel) leaves the estimate counted. Unknown or already
        released tickets are ignored. A correction after the admission has left the
        window changes nothing.
        """
        entry = self._in_flight.pop(ticket, None)
        if entry is None:
            return
        if math.isinf(entry.expires_at):
            self._bound(entry)
        if actual_tokens is None:
            return
        self._warm = True
        actual = max(0, actual_tokens)
        if entry.in_window:
            self._window_tokens += actual - entry.tokens
        entry.tokens = actual

    def cooldown(self, duration_s: float) -> None:
        """Admit nothing until ``now + duration_s``; extends a cooldown, never shortens it."""
        if not duration_s > 0 or math.isinf(duration_s):
            return
        until = self._clock() + duration_s
        if self._cooldown_until is None or until > self._cooldown_until:
            self._cooldown_until = until
            logger.info("gate %s cooling down for %.3f s", self._name, duration_s)

    def lift_cooldown(self) -> None:
        """End a cooldown now: a user asked to try again (resume from RATE_LIMITED)."""
        self._cooldown_until = None

    def observe_headers(self, headers: Mapping[str, str]) -> None:
        """Learn from a provider's ``x-ratelimit-*`` headers; malformed values are ignored.

        Learnt limits (assumed per minute) replace earlier learnt ones and tighten the
        configured limits, never loosen them. ``remaining-*`` of 0 with a ``reset-*``
        duration starts a cooldown until that reset.
        """
        lowered = {str(k).lower(): str(v) for k, v in headers.items()}
        learnt = {
            "rpm": parse_count(lowered.get("x-ratelimit-limit-requests"), minimum=1),
            "tpm": parse_count(lowered.get("x-ratelimit-limit-tokens"), minimum=1),
        }
        update = {name: value for name, value in learnt.items() if value is not None}
        if update and update != {n: getattr(self._learnt, n) for n in update}:
            self._learnt = self._learnt.model_copy(update=update)
            logger.info("gate %s learnt limits %s from headers", self._name, update)
        for kind in ("requests", "tokens"):
            remaining = parse_count(lowered.get(f"x-ratelimit-remaining-{kind}"), minimum=0)
            reset_s = parse_duration_s(lowered.get(f"x-ratelimit-reset-{kind}", ""))
            if remaining == 0 and reset_s is not None:
                self.cooldown(reset_s)

    def waiting(self) -> int:
        """Tickets queued, not yet admitted."""
        return len(self._queued)

    def in_flight(self) -> int:
        """Tickets admitted and not yet released."""
        return len(self._in_flight)

    def stats(self) -> dict[str, Any]:
        """A snapshot for status pages and tests."""
        now = self._clock()
        self._prune(now)
        cooling = self._cooldown_until is not None and now < self._cooldown_until
        return {
            "window_s": self._window_s,
            "requests_in_window": len(self._window),
            "tokens_in_window": self._window_tokens,
            "in_flight": len(self._in_flight),
            "cooldown_until": self._cooldown_until if cooling else None,
            "cooldown_s": self._cooldown_until - now if cooling else 0.0,
            "queued": {session: len(queue) for session, queue in self._queues.items()},
            "limits": self.limits.model_dump(),
        }

    def _head(self) -> _Queued:
        return next(iter(self._queues.values()))[0]

    def _admit_head(self, now: float) -> str:
        session_id, queue = next(iter(self._queues.items()))
        item = queue.popleft()
        if queue:
            self._queues.move_to_end(session_id)
        else:
            del self._queues[session_id]
        del self._queued[item.ticket]
        expires = now + self._window_s + self._margin_s if self._warm else math.inf
        entry = _Admission(item.ticket, session_id, now, expires, item.est_tokens)
        bisect.insort(self._window, entry, key=_expiry)
        self._window_tokens += entry.tokens
        self._in_flight[item.ticket] = entry
        return item.ticket

    def _bound(self, entry: _Admission) -> None:
        """A call admitted cold ended: it stays in the window for a whole window more."""
        self._window.remove(entry)
        end = self._clock() + self._window_s
        entry.expires_at = max(entry.admitted_at + self._window_s + self._margin_s, end)
        bisect.insort(self._window, entry, key=_expiry)

    def _prune(self, now: float) -> None:
        expired = bisect.bisect_right(self._window, now, key=_expiry)
        for entry in self._window[:expired]:
            entry.in_window = False
            self._window_tokens -= entry.tokens
        del self._window[:expired]
        if self._cooldown_until is not None and self._cooldown_until <= now:
            self._cooldown_until = None

    def _wait_s(self, est_tokens: int, now: float) -> float | None:
        """Seconds until a ticket of ``est_tokens`` fits (window pruned to ``now``)."""
        limits = self.limits
        if limits.max_concurrency is not None and len(self._in_flight) >= limits.max_concurrency:
            return None
        waits = [
            0.0,
            self._rpm_wait_s(limits.rpm, now),
            self._tpm_wait_s(limits.tpm, est_tokens, now),
        ]
        if self._cooldown_until is not None:
            waits.append(self._cooldown_until - now)
        wait = max(waits)
        return None if math.isinf(wait) else wait  # behind a cold call: only its end frees it

    def _rpm_wait_s(self, rpm: int | None, now: float) -> float:
        if rpm is None or len(self._window) < rpm:
            return 0.0
        return self._window[len(self._window) - rpm].expires_at - now

    def _tpm_wait_s(self, tpm: int | None, est_tokens: int, now: float) -> float:
        if tpm is None:
            return 0.0
        allowed = max(0, tpm - est_tokens)
        used = self._window_tokens
        if used <= allowed:
            return 0.0
        for entry in self._window:
            used -= entry.tokens
            if used <= allowed:
                return entry.expires_at - now
        return 0.0  # unreachable: an empty window holds no tokens


class GateRegistry:
    """One ``AdmissionGate`` per ``GateKey``, shared by every session on that key."""

    def __init__(
        self, clock: Clock = time.monotonic, margin_s: float = 0.0, window_s: float | None = None
    ) -> None:
        self._clock = clock
        self._margin_s = margin_s
        self._window_s = settings().rate_window_s if window_s is None else window_s
        self._gates: dict[GateKey, AdmissionGate] = {}

    def gate(self, key: GateKey, limits: GateLimits) -> AdmissionGate:
        """The gate for ``key``, created on first use; ``limits`` are merged into it."""
        gate = self._gates.get(key)
        if gate is None:
            name = f"{key.model}@{key.api_base or 'default'}"
            gate = self._gates[key] = AdmissionGate(
                limits, self._clock, name=name, margin_s=self._margin_s, window_s=self._window_s
            )
        else:
            gate.configure(limits)
        return gate

    def gates(self) -> dict[GateKey, AdmissionGate]:
        """Every gate created so far."""
        return dict(self._gates)


def estimate_tokens(messages: list[dict], tools: list[dict] | None = None) -> int:
    """A rough token count of a request: a quarter of its JSON's characters, at least 1."""
    chars = len(json.dumps(messages, default=str, ensure_ascii=False))
    if tools:
        chars += len(json.dumps(tools, default=str, ensure_ascii=False))
    return tokens_of(chars)


def tokens_of(chars: int) -> int:
    """``estimate_tokens`` of a request whose JSON is ``chars`` long (``llm.history`` keeps
    that length as the history grows)."""
    return max(1, (chars + 3) // 4)
