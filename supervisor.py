"""Supervision, as the design draws it: a supervisor starts its children from ``ChildSpec``s
and restarts a dead one alone (one for one), under a ``RestartPolicy``:

- at most ``intensity`` restarts of one child in ``period_s`` seconds; past that it gives
  up on the child for a cooldown that doubles each round (``giveup_cooldown_s`` up to
  ``giveup_cooldown_max_s``), then starts it again from a clean budget by itself; after
  ``giveup_rounds`` rounds it stays down until someone restarts it (a user's resume);
- the first restart at once; between later tries an exponential backoff with full
  jitter, as a timer, never a sleep.

``RestartPolicy`` and ``RestartBudget`` are plain objects: the budget takes its clock and
random source as arguments, so every rule is tested on a fake clock
(``tests/test_restarts.py``). ``Supervisor`` is the actor base that applies them: it hears
of a dead child through Thespian's ``ChildActorExited`` (within milliseconds of a SIGKILL
on multiprocTCPBase), and counts intensity per child, so one flapping session never takes
its siblings down. Beside the actor layer (``actors/``), this is the only module that
knows Thespian.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from thespian.actors import ActorAddress, ActorExitRequest, ChildActorExited

from .actors import reaping
from .actors.base import Failing, Timer
from .actors.probing import Probing
from .config.models import RestartPolicy


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


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChildSpec:
    """How to start one child: its class, and what to tell it once created."""

    role: str
    actor_class: type
    boot: Callable[[int], Any]
    """Builds the first message for incarnation ``n`` (1 for the first start)."""
    restart: bool = True
    """False: a child that is never restarted (it is simply gone when it dies)."""


@dataclass
class _Child:
    spec: ChildSpec
    budget: RestartBudget
    address: ActorAddress | None = None
    incarnation: int = 0
    last_words: str = ""

    @property
    def given_up(self) -> bool:
        return self.budget.given_up


class Supervisor(Probing):
    """Base for actors that supervise children. Subclasses hook the ``on_child_*`` methods."""

    role = "supervisor"

    def __init__(self) -> None:
        super().__init__()
        self.policy = RestartPolicy()
        self._children: dict[str, _Child] = {}
        # addresses, compared with ==: one Thespian made for a child it has not heard from
        # yet reads "LocalAddr.N" and becomes equal to the child's real address later
        self._expected_exits: list[ActorAddress] = []
        self._helpers: list[ActorAddress] = []

    # -- public ----------------------------------------------------------------

    def supervise(self, spec: ChildSpec) -> ActorAddress:
        """Start a child under this supervisor and return its address."""
        child = _Child(spec=spec, budget=RestartBudget(self.policy))
        self._children[spec.role] = child
        return self._start(child)

    def child(self, role: str) -> ActorAddress | None:
        entry = self._children.get(role)
        return entry.address if entry and not entry.given_up else None

    def stop_child(self, role: str, forget: bool = True) -> None:
        """Ask a child to exit; its exit is expected and never restarted."""
        entry = self._children.get(role)
        if entry is None:
            return
        if entry.address is not None:
            self._expected_exits.append(entry.address)
            self.send(entry.address, ActorExitRequest())
        if forget:
            del self._children[role]
            self.forget_probing(role)

    def start_helper(self, actor_class: type, first: Any) -> ActorAddress:
        """Start a one-shot child, tell it ``first``, and never restart it: its exit is
        expected (``on_helper_exited`` hears of it)."""
        address = self.createActor(actor_class)
        self._helpers.append(address)
        self.send(address, first)
        return address

    def gave_up_on(self, role: str) -> bool:
        """Whether ``role`` is down past its restart intensity (in a cooldown, or for good)."""
        entry = self._children.get(role)
        return entry is not None and entry.given_up

    def restart_child(self, role: str, reason: str, by_user: bool = True) -> ActorAddress | None:
        """Start a given-up child again from a clean budget (a user's resume, which also
        grants the full number of cooldown rounds again, or a cooldown's end)."""
        entry = self._children.get(role)
        if entry is None:
            return None
        entry.budget.restarted(by_hand=by_user)
        if entry.address is not None:
            self._expected_exits.append(entry.address)
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

    def on_helper_exited(self, address: ActorAddress) -> None:
        """A one-shot child from ``start_helper`` is gone (its work done, or not)."""

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
        if self._stopping:
            return  # the whole subtree is shutting down; nothing to restart
        if _take(self._expected_exits, child_address):
            return
        if _take(self._helpers, child_address):
            self.on_helper_exited(child_address)
            return
        for role, child in list(self._children.items()):
            if child.address is not None and child.address == child_address:
                failed = reaping.start_failure(child_address)
                reason = child.last_words or (
                    f"its process could not be started ({failed})" if failed
                    else "exited unexpectedly (killed or crashed)")
                child.last_words = ""
                self._child_died(role, reason)
                return
        self.drop(ChildActorExited(child_address), f"{child_address} is not a live child")

    def _child_died(self, role: str, reason: str) -> None:
        child = self._children[role]
        child.address = None
        logger.warning("%s: child %s died: %s", self.role, role, reason)
        if not child.spec.restart:
            del self._children[role]
            self.forget_probing(role)
            return
        restart, wait_s = child.budget.failed()
        if not restart:
            if wait_s is not None:
                self.after(wait_s, "cooldown_over", (role, child.incarnation))
            self.on_child_gave_up(role, reason, wait_s)
            return
        self.on_child_down(role, reason)
        self.after(wait_s or 0.0, "restart", ((role,), reason))

    def may_restart(self, role: str) -> bool:
        """Whether a failed ``role`` may be started again now (a subclass's say)."""
        return True

    def on_timer_cooldown_over(self, token: tuple[str, int]) -> None:
        role, incarnation = token
        child = self._children.get(role)
        if child is None or not child.given_up or child.incarnation != incarnation:
            self.drop(Timer("cooldown_over", token), f"{role} is back or gone already")
            return
        if not self.may_restart(role):
            self.drop(Timer("cooldown_over", token), f"{role} is not to be started again now")
            return
        self.restart_child(role, f"cooldown over after give-up round {child.budget.rounds}; "
                           "trying again", by_user=False)

    def on_timer_restart(self, token: tuple[tuple[str, ...], str]) -> None:
        roles, reason = token
        started = 0
        for role in roles:
            child = self._children.get(role)
            if child is None or child.given_up or child.address is not None \
                    or not self.may_restart(role):
                continue  # stopped, given up, started again meanwhile, or not to be
            address = self._start(child)
            self.on_child_restarted(role, address, child.incarnation, reason)
            started += 1
        if not started:
            self.drop(Timer("restart", token), f"{', '.join(roles)} back or gone already")


def _take(addresses: list[ActorAddress], address: ActorAddress) -> bool:
    """Remove ``address`` from ``addresses`` if it is there (by ==); whether it was."""
    for i, known in enumerate(addresses):
        if known == address:
            del addresses[i]
            return True
    return False
