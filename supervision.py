"""Reusable supervision: child specs, restart policies, and the Supervisor actor base.

A supervisor starts its children from ``ChildSpec``s and hears of a dead child through
Thespian's ``ChildActorExited`` (within milliseconds of a SIGKILL on multiprocTCPBase).
It restarts it under its ``RestartPolicy``:

- strategy ``one_for_one`` restarts the dead child alone; ``one_for_all`` restarts every
  child; ``rest_for_one`` restarts the dead child and those started after it;
- at most ``intensity`` restarts of one child in ``period_s`` seconds; past that the
  supervisor gives up on it (``on_child_gave_up``) for a cooldown that doubles each round
  (``giveup_cooldown_s`` up to ``giveup_cooldown_max_s``), then starts it again from a
  clean budget by itself; after ``giveup_rounds`` rounds it stays down until someone
  calls ``restart_child`` (a user's resume) (promise I5);
- between tries an exponential backoff with full jitter, as a timer, never a sleep.

Intensity is counted per child, so one flapping session never takes its siblings down.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from thespian.actors import ActorAddress, ActorExitRequest, ChildActorExited

from .actors.base import Failing, Timer, TrouperActor

logger = logging.getLogger(__name__)

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
RestartType = Literal["permanent", "transient", "temporary"]


class RestartPolicy(BaseModel):
    """How a supervisor restarts its children."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: Strategy = "one_for_one"
    intensity: int = 5
    """Restarts of one child allowed within ``period_s``; past that the supervisor gives up."""
    period_s: float = 60.0
    backoff_initial_s: float = 0.05
    """Upper bound of the first wait before a restart."""
    backoff_max_s: float = 5.0
    """Cap on one wait before a restart."""
    giveup_cooldown_s: float = 30.0
    """After giving up on a child: wait this long, then try it again from a clean start."""
    giveup_cooldown_max_s: float = 300.0
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
        """Full jitter: uniform in [0, min(max, initial * 2**(restarts-1))]."""
        tries = max(1, len(self._restarts))
        ceiling = min(self._policy.backoff_max_s, self._policy.backoff_initial_s * 2 ** (tries - 1))
        return self._rng.uniform(0.0, ceiling)

    def reset(self) -> None:
        self._restarts.clear()

    def quiet(self) -> bool:
        """True when no restart counts in the window now: the child had a calm period."""
        self._trim(self._clock())
        return not self._restarts


@dataclass(frozen=True)
class ChildSpec:
    """How to start one child: its class, and what to tell it once created."""

    role: str
    actor_class: type
    boot: Callable[[int], Any]
    """Builds the first message for incarnation ``n`` (1 for the first start)."""
    restart: RestartType = "permanent"
    """``permanent`` always restarts; ``transient`` only after a failure it announced or a
    kill; ``temporary`` never."""


@dataclass
class _Child:
    spec: ChildSpec
    budget: RestartBudget
    address: ActorAddress | None = None
    incarnation: int = 0
    order: int = 0
    last_words: str = ""
    given_up: bool = False
    rounds: int = 0
    """Give-up rounds in a row (reset by a calm period or a user's restart)."""


class Supervisor(TrouperActor):
    """Base for actors that supervise children. Subclasses hook the ``on_child_*`` methods."""

    role = "supervisor"

    def __init__(self) -> None:
        super().__init__()
        self.policy = RestartPolicy()
        self._children: dict[str, _Child] = {}
        self._expected_exits: set[str] = set()
        self._order = 0

    # -- public ----------------------------------------------------------------

    def supervise(self, spec: ChildSpec) -> ActorAddress:
        """Start a child under this supervisor and return its address."""
        self._order += 1
        child = _Child(spec=spec, budget=RestartBudget(self.policy), order=self._order)
        self._children[spec.role] = child
        return self._start(child)

    def child(self, role: str) -> ActorAddress | None:
        entry = self._children.get(role)
        return entry.address if entry and not entry.given_up else None

    def incarnation(self, role: str) -> int:
        entry = self._children.get(role)
        return entry.incarnation if entry else 0

    def stop_child(self, role: str, forget: bool = True) -> None:
        """Ask a child to exit; its exit is expected and never restarted."""
        entry = self._children.get(role)
        if entry is None:
            return
        if entry.address is not None:
            self._expected_exits.add(str(entry.address))
            self.send(entry.address, ActorExitRequest())
        if forget:
            del self._children[role]

    def restart_child(self, role: str, reason: str, by_user: bool = True) -> ActorAddress | None:
        """Start a given-up child again from a clean budget (a user's resume, which also
        grants the full number of cooldown rounds again, or a cooldown's end)."""
        entry = self._children.get(role)
        if entry is None:
            return None
        entry.given_up = False
        entry.budget.reset()
        if by_user:
            entry.rounds = 0
        if entry.address is not None:
            self._expected_exits.add(str(entry.address))
            self.send(entry.address, ActorExitRequest())
        address = self._start(entry)
        self.on_child_restarted(role, address, entry.incarnation, reason)
        return address

    # -- hooks -------------------------------------------------------------------

    def on_child_started(self, role: str, address: ActorAddress, incarnation: int) -> None:
        """A child was started (first start or restart)."""

    def on_child_restarted(
        self, role: str, address: ActorAddress, incarnation: int, reason: str
    ) -> None:
        """A child was restarted after ``reason``."""

    def on_child_gave_up(self, role: str, reason: str, retry_in_s: float | None) -> None:
        """Past its restart intensity, ``role`` is down: for ``retry_in_s`` seconds, after
        which it is started again, or (None) until ``restart_child``."""

    def on_child_down(self, role: str, reason: str) -> None:
        """A child died and a restart is scheduled (siblings may want to know at once)."""

    # -- machinery -------------------------------------------------------------------

    def _start(self, child: _Child) -> ActorAddress:
        child.incarnation += 1
        address = self.createActor(child.spec.actor_class)
        child.address = address
        self.send(address, child.spec.boot(child.incarnation))
        self.on_child_started(child.spec.role, address, child.incarnation)
        return address

    def on_failing(self, msg: Failing, sender: ActorAddress) -> None:
        for child in self._children.values():
            if child.address is not None and child.address == sender:
                child.last_words = msg.reason
                return
        self.drop(msg, f"last words from {sender}, not a live child")

    def on_child_exited(self, child_address: ActorAddress, sender: ActorAddress) -> None:
        key = str(child_address)
        if self._stopping:
            return  # the whole subtree is shutting down; nothing to restart
        if key in self._expected_exits:
            self._expected_exits.discard(key)
            return
        for role, child in list(self._children.items()):
            if child.address is not None and child.address == child_address:
                reason = child.last_words or "exited unexpectedly (killed or crashed)"
                child.last_words = ""
                self._child_died(role, reason)
                return
        self.drop(ChildActorExited(child_address), f"{child_address} is not a live child")

    def _child_died(self, role: str, reason: str) -> None:
        child = self._children[role]
        child.address = None
        logger.warning("%s: child %s died: %s", self.role, role, reason)
        if child.spec.restart == "temporary":
            del self._children[role]
            return
        if child.budget.quiet():
            child.rounds = 0
        if not child.budget.allow():
            child.given_up = True
            child.rounds += 1
            retry_in_s = self.policy.cooldown_s(child.rounds)
            if retry_in_s is not None:
                self.after(retry_in_s, "cooldown_over", (role, child.incarnation))
            self.on_child_gave_up(role, reason, retry_in_s)
            return
        affected = self._affected(role)
        for other in affected:
            if other != role:
                self._stop_for_restart(other)
        self.on_child_down(role, reason)
        self.after(child.budget.backoff_s(), "restart", (tuple(affected), reason))

    def _affected(self, role: str) -> list[str]:
        ordered = sorted(self._children, key=lambda r: self._children[r].order)
        if self.policy.strategy == "one_for_all":
            return [r for r in ordered if not self._children[r].given_up]
        if self.policy.strategy == "rest_for_one":
            start = self._children[role].order
            return [r for r in ordered if self._children[r].order >= start]
        return [role]

    def _stop_for_restart(self, role: str) -> None:
        child = self._children[role]
        if child.address is not None:
            self._expected_exits.add(str(child.address))
            self.send(child.address, ActorExitRequest())
            child.address = None

    def on_timer_cooldown_over(self, token: tuple[str, int]) -> None:
        role, incarnation = token
        child = self._children.get(role)
        if child is None or not child.given_up or child.incarnation != incarnation:
            self.drop(Timer("cooldown_over", token), f"{role} is back or gone already")
            return
        self.restart_child(role, f"cooldown over after give-up round {child.rounds}; "
                           "trying again", by_user=False)

    def on_timer_restart(self, token: tuple[tuple[str, ...], str]) -> None:
        roles, reason = token
        started = 0
        for role in roles:
            child = self._children.get(role)
            if child is None or child.given_up or child.address is not None:
                continue  # stopped, given up, or started again meanwhile
            address = self._start(child)
            self.on_child_restarted(role, address, child.incarnation, reason)
            started += 1
        if not started:
            self.drop(Timer("restart", token), f"{', '.join(roles)} back or gone already")
