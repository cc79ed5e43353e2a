"""How long the broker waits before trying a failed model call again: a pure policy.

No clock and no sleeping: the broker asks for a wait and sets a timer. The random source
is passed in, so a test with a seeded ``random.Random`` checks every rule instantly.

The wait before retry ``n`` (1 for the first retry on a model) is **full jitter above a
floor**: uniform in ``[min_s, min(max_s, min_s * 2**n)]``. The range's top doubles with
each retry up to the cap, and the whole range is drawn from, so sessions that failed
together do not retry together (the first retry is already spread over
``[min_s, 2 * min_s]``); ``min_s`` stays a true minimum, as its name in the LLM config
(``retry_min_wait_s``) promises. When the provider said how long to wait
(``Retry-After``), the wait is exactly that, capped at ``max_s``. The cap wins over the
floor when the two disagree; ``min_s`` of 0 retries at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..config.models import LLMConfig


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts of one call; see the module docstring."""

    min_s: float
    """The shortest wait, and the base the ceiling doubles from."""
    max_s: float
    """The cap on one wait, ``Retry-After`` included."""
    total_s: float
    """The cap on all waits of one call together."""
    rng: random.Random

    @classmethod
    def of(cls, llm: LLMConfig, rng: random.Random) -> Backoff:
        """The backoff a session's LLM config asks for."""
        return cls(llm.retry_min_wait_s, llm.retry_max_wait_s, llm.retry_total_s, rng)

    def ceiling_s(self, retry: int) -> float:
        """The longest wait before retry ``retry`` (1-based) when the provider said nothing."""
        exponent = min(max(retry, 1), 64)  # 2**64 times any minimum is past every cap
        return min(self.max_s, self.min_s * 2.0**exponent)

    def wait_s(self, retry: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait before retry ``retry`` (1 for the first retry on a model).

        ``retry_after_s`` is what the provider asked for, or None when it said nothing.
        """
        if retry_after_s is not None:
            return min(max(0.0, retry_after_s), self.max_s)
        ceiling = self.ceiling_s(retry)
        return self.rng.uniform(min(self.min_s, ceiling), ceiling)

    def within_budget(self, waited_s: float, wait_s: float) -> bool:
        """Whether a call that already waited ``waited_s`` may wait ``wait_s`` more."""
        return waited_s + wait_s <= self.total_s
