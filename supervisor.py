"""How supervisors restart a child: the policy and the per-child budget (no Thespian here).

A supervisor (``actors/supervision.py``) restarts a dead child alone (one for one):

- at most ``intensity`` restarts of one child in ``period_s`` seconds; past that it gives
  up on the child for a cooldown that doubles each round (``giveup_cooldown_s`` up to
  ``giveup_cooldown_max_s``), then starts it again from a clean budget by itself; after
  ``giveup_rounds`` rounds it stays down until someone restarts it (a user's resume);
- the first restart at once; between later tries an exponential backoff with full
  jitter, as a timer, never a sleep.

``RestartBudget`` takes its clock and random source as arguments, so every rule here is
tested on a fake clock (``tests/test_restarts.py``).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field


class RestartPolicy(BaseModel):
    """How a supervisor restarts its children."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    intensity: int = Field(default=5, ge=0)
    """Restarts of one child allowed within ``period_s``; past that the supervisor gives up."""
    period_s: float = Field(default=60.0, gt=0)
    backoff_initial_s: float = Field(default=0.05, ge=0)
    """Upper bound of the wait before the second restart in ``period_s`` (the first is
    at once); it doubles for each one after."""
    backoff_max_s: float = Field(default=5.0, ge=0)
    """Cap on one wait before a restart."""
    giveup_cooldown_s: float = Field(default=30.0, ge=0)
    """After giving up on a child: wait this long, then try it again from a clean start."""
    giveup_cooldown_max_s: float = Field(default=300.0, ge=0)
    """Cap on the cooldown, which doubles each round."""
    giveup_rounds: int = Field(default=3, ge=0)
    """Cooldown rounds before a child stays down until a user resumes; 0 never retries."""

    def cooldown_s(self, round_no: int) -> float | None:
        """The wait after give-up round ``round_no`` (1 for the first); None: stay down."""
        if round_no > self.giveup_rounds:
            return None
        return min(self.giveup_cooldown_max_s, self.giveup_cooldown_s * 2 ** (round_no - 1))


class RestartBudget:
    """Counts one child's restarts in a sliding window and picks the backoff before each."""

    def __init__(
        self,
        policy: RestartPolicy,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._policy = policy
        self._clock = clock
        self._rng = rng or random.Random()
        self._restarts: deque[float] = deque()
        self._reset_at: float | None = None
        self.given_up = False
        """Past the intensity: down for a cooldown, or until restarted by hand."""
        self.rounds = 0
        """Give-up rounds in a row (reset by a calm period or a restart by hand)."""

    def _trim(self, now: float) -> None:
        while self._restarts and now - self._restarts[0] > self._policy.period_s:
            self._restarts.popleft()

    def allow(self) -> bool:
        """Record a restart if one more fits in the window; False means give up."""
        now = self._clock()
        self._trim(now)
        if len(self._restarts) >= self._policy.intensity:
            return False
        self._restarts.append(now)
        return True

    def backoff_s(self) -> float:
        """0 for the first restart in the window (a lone crash costs no wait: a killed
        proxy's session is back sooner), then full jitter: uniform in
        [0, min(max, initial * 2**(restarts-2))]."""
        tries = len(self._restarts)
        if tries <= 1:
            return 0.0
        ceiling = min(self._policy.backoff_max_s, self._policy.backoff_initial_s * 2 ** (tries - 2))
        return self._rng.uniform(0.0, ceiling)

    def reset(self) -> None:
        """Forget the restarts counted (a clean budget); the window since then must pass
        before the child counts as calm again (``quiet``)."""
        self._restarts.clear()
        self._reset_at = self._clock()

    def failed(self) -> tuple[bool, float | None]:
        """The child failed. ``(True, wait)``: restart it in ``wait`` seconds. ``(False,
        cooldown)``: past the intensity it is given up on for round ``rounds``, to be
        started again in ``cooldown`` seconds, or (None) only when restarted by hand."""
        if self.quiet():
            self.rounds = 0
        if self.allow():
            return True, self.backoff_s()
        self.given_up = True
        self.rounds += 1
        return False, self._policy.cooldown_s(self.rounds)

    def restarted(self, by_hand: bool) -> None:
        """Started again from a clean budget (a cooldown's end, or ``by_hand``: a user's
        resume, which also grants every cooldown round again)."""
        self.given_up = False
        self.reset()
        if by_hand:
            self.rounds = 0

    def quiet(self) -> bool:
        """True when the child had a calm period: no restart counts in the window now,
        and the window has passed since the budget was last reset (a child that dies
        right after a cooldown's restart is in its next give-up round, not calm)."""
        now = self._clock()
        self._trim(now)
        calm_since_reset = self._reset_at is None or now - self._reset_at > self._policy.period_s
        return not self._restarts and calm_since_reset


def give_up_text(what: str, policy: RestartPolicy, reason: str,
                 retry_in_s: float | None) -> tuple[str, datetime | None]:
    """What the session's log says when ``what`` (the sandbox, the agent loop) is down past
    its restart intensity, and when it comes back by itself (None: when the user resumes)."""
    failures = policy.intensity + 1
    text = (f"{what} failed {failures} time{'' if failures == 1 else 's'} within "
            f"{policy.period_s:g} s "
            f"(last: {reason}); "
            + (f"trying again in {retry_in_s:g} s" if retry_in_s is not None
               else "resume to try again"))
    resumes_at = (datetime.now(UTC) + timedelta(seconds=retry_in_s)
                  if retry_in_s is not None else None)
    return text, resumes_at
