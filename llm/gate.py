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
  ``t`` counts while ``now < t + window_s + margin_s``.
- ``tpm``: the tokens admitted in the last window plus the ticket's estimate must be at most
  ``tpm``. Estimates are corrected to the actual count on ``release``. A ticket larger than
  ``tpm`` on its own is admitted once the window holds no tokens, rather than never.
- ``max_concurrency``: tickets admitted and not yet released (or cancelled).
- cooldown: after a 429 (or headers saying nothing is left), nothing is admitted until it ends.

Fairness: queued tickets are served **round-robin across sessions, FIFO within a session**.
Sessions with queued tickets stand in a ring; each admission serves the session at the head
of the ring, which then goes to the back (behind every other waiting session, including one
that just arrived). So a session waiting behind N others is served within N admissions, however
many calls they have queued. The next ticket in that order is never overtaken: when it does
not fit (say a large estimate under ``tpm``), nothing behind it starts either, so a large
call cannot be starved by a stream of small ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..settings import settings

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


@dataclass
class _Admission:
    """One admitted ticket: a window entry while it is younger than the window."""

    ticket: str
    session_id: str
    expires_at: float
    """Clock time at which it leaves the window (admission + window + margin)."""
    tokens: int
    in_window: bool = True


class AdmissionGate:
    """Decides which queued calls on one key may start now; see the module docstring."""

    def __init__(
        self,
        limits: GateLimits,
        clock: Clock = time.monotonic,
        name: str = "",
        margin_s: float = 0.0,
        window_s: float | None = None,
    ) -> None:
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
        self._window: deque[_Admission] = deque()
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

        ``None`` when nothing is queued, or when only a release (a freed concurrency slot)
        can unblock it.
        """
        if not self._queues:
            return None
        now = self._clock()
        self._prune(now)
        return self._wait_s(self._head().est_tokens, now)

    def release(self, ticket: str, actual_tokens: int | None = None) -> None:
        """The call ended: free its slot and correct its tokens to ``actual_tokens``.

        Unknown or already released tickets are ignored. A correction after the admission
        has left the window changes nothing.
        """
        entry = self._in_flight.pop(ticket, None)
        if entry is None or actual_tokens is None:
            return
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
            "rpm": _parse_count(lowered.get("x-ratelimit-limit-requests"), minimum=1),
            "tpm": _parse_count(lowered.get("x-ratelimit-limit-tokens"), minimum=1),
        }
        update = {name: value for name, value in learnt.items() if value is not None}
        if update and update != {n: getattr(self._learnt, n) for n in update}:
            self._learnt = self._learnt.model_copy(update=update)
            logger.info("gate %s learnt limits %s from headers", self._name, update)
        for kind in ("requests", "tokens"):
            remaining = _parse_count(lowered.get(f"x-ratelimit-remaining-{kind}"), minimum=0)
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
        expires = now + self._window_s + self._margin_s
        entry = _Admission(item.ticket, session_id, expires, item.est_tokens)
        self._window.append(entry)
        self._window_tokens += entry.tokens
        self._in_flight[item.ticket] = entry
        return item.ticket

    def _prune(self, now: float) -> None:
        while self._window and self._window[0].expires_at <= now:
            entry = self._window.popleft()
            entry.in_window = False
            self._window_tokens -= entry.tokens
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
        return max(waits)

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


def _parse_count(text: str | None, minimum: int) -> int | None:
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


def estimate_tokens(messages: list[dict], tools: list[dict] | None = None) -> int:
    """A rough token count of a request: a quarter of its JSON's characters, at least 1."""
    chars = len(json.dumps(messages, default=str, ensure_ascii=False))
    if tools:
        chars += len(json.dumps(tools, default=str, ensure_ascii=False))
    return max(1, (chars + 3) // 4)
