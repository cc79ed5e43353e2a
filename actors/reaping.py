"""Every dead child is reported to its parent: a seam of Thespian's child bookkeeping.

On ``multiprocTCPBase`` a parent hears of a dead child from its SIGCHLD handler:
``MultiProcReplicator.childDied`` sorts the parent's ``_child_procs`` into live and dead
and sends itself a ``ChildActorExited`` for each dead one. But after the actor has handled
*any* ``ChildActorExited``, Thespian 4.0.1 calls ``_childExited``, which drops every child
that is dead by then from ``_child_procs`` and reports none of them. A second child that
dies while its parent is still handling the first one's exit is reaped there in silence;
its own SIGCHLD then finds nothing, and the parent never hears of it.

For trouper that was a stuck session: a SessionSupervisor handling its killed
RuntimeProxy's exit lost the exit of its Controller killed a moment later, kept sending
the sandbox's news to a dead process and never restarted it (the chaos test in
``tests/test_recovery.py`` now and then, more often on a loaded machine). ``install`` makes
``_childExited`` report each child it reaps besides the one whose exit was handled,
exactly as ``childDied`` would have. A child whose exit is reported twice (its own
goodbye and the SIGCHLD, which Thespian already does for an actor that exits on purpose)
is dropped by the supervisors as "not a live child".

A child whose process could not be made (``fork`` failing: a pids limit, no memory) is
also reported as an exit by Thespian, which logs the error only to its own log; the
parent would say "exited unexpectedly". ``install`` also keeps why
(``MultiProcReplicator._startChildActor`` raising), for the supervisor to say it
(``start_failure``).
"""

from __future__ import annotations

import logging
from typing import Any

from thespian.actors import ChildActorExited
from thespian.system import multiprocCommon
from thespian.system.addressManager import CannotPickleAddress
from thespian.system.transport import TransmitIntent

logger = logging.getLogger(__name__)


def install() -> None:
    """Patch ``MultiProcReplicator._childExited`` (idempotent). Raises RuntimeError if the
    seam is gone, so a Thespian upgrade fails loudly instead of losing exits again."""
    replicator = getattr(multiprocCommon, "MultiProcReplicator", None)
    original = getattr(replicator, "_childExited", None)
    if replicator is None or original is None or not hasattr(replicator, "childDied"):
        raise RuntimeError("thespian.system.multiprocCommon.MultiProcReplicator."
                           "_childExited is missing")
    if not getattr(original, "_trouper_reaping", False):
        replicator._childExited = _child_exited  # type: ignore[attr-defined]
    start = getattr(replicator, "_startChildActor", None)
    if start is None:
        raise RuntimeError("thespian.system.multiprocCommon.MultiProcReplicator."
                           "_startChildActor is missing")
    if not getattr(start, "_trouper_reaping", False):
        replicator._startChildActor = _kept_failure(start)  # type: ignore[attr-defined]


MAX_FAILURES = 64
"""Start failures kept (the oldest let go first): each is read once, at the exit."""
_failures: list[tuple[Any, str]] = []
"""(child address, why its process could not be started), in this process."""


def start_failure(address: Any) -> str | None:
    """Why the process of the child at ``address`` could not be started, once; None if it
    was (or nothing is known)."""
    for i, (failed, why) in enumerate(_failures):
        if failed == address:
            del _failures[i]
            return why
    return None


def _kept_failure(start: Any) -> Any:
    def start_child_actor(self: Any, child_address: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return start(self, child_address, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - kept, then Thespian's own handling
            _failures.append((child_address, f"{type(exc).__name__}: {exc}"))
            del _failures[:-MAX_FAILURES]
            raise

    start_child_actor._trouper_reaping = True  # type: ignore[attr-defined]
    return start_child_actor


def _child_exited(self: Any, child_address: Any) -> None:
    """Thespian's ``_childExited``, and a ``ChildActorExited`` for every other child it
    finds dead (those would otherwise never be reported: see the module doc)."""
    live, dead = [], []
    for info in getattr(self, "_child_procs", []):
        (live if self._checkChildLiveness(info) else dead).append(info)
    self._child_procs = live
    for info in dead:
        address = getattr(info, "childRealAddr", info.childAddr)
        if address == child_address:
            continue  # the exit just handled
        logger.info("a child (%s) died while its parent handled another child's exit; "
                    "reporting it", address)
        try:
            self.transport.scheduleTransmit(
                None, TransmitIntent(self.transport.myAddress, ChildActorExited(address)))
        except CannotPickleAddress:  # as childDied: a child that never connected back
            logger.error("child %s is dead but its address cannot be reported", address)


_child_exited._trouper_reaping = True  # type: ignore[attr-defined]


def child_pid(actor: Any, address: Any) -> int | None:
    """The pid of the live child process at ``address`` of ``actor`` (from the actor's
    Thespian manager: ``MultiProcReplicator._child_procs``); None if it knows none."""
    manager = getattr(actor, "_myRef", None)
    for info in getattr(manager, "_child_procs", None) or []:
        if getattr(info, "childRealAddr", info.childAddr) == address or info.childAddr == address:
            pid = getattr(info.childProc, "pid", None)
            return pid if isinstance(pid, int) and pid > 0 else None
    return None
