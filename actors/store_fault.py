"""The Controller's store-fault mode (I6 in docs/promises.md: a failed write is a state).

A failed append raises ``StoreUnavailable`` (disk full, read-only, locked, corrupt). The
effects after it are not performed, so nothing runs whose intent is not durable (I2),
and the Controller enters *store-fault mode*: it tells the tree (clients show the cause
while the log cannot hold it), refuses a user's command at once with the cause, drops
the other inputs (a model reply is asked again later; a tool's outcome stays in the
sandbox's journal), and probes the store on a growing timer. Each probe rebuilds the core
from the log (as a restarted Controller would: the old one ran ahead of the log when the
write failed) and performs what the core makes of the fault (``SessionCore.store_fault``:
ERROR, a row of the core's table). Once that record goes through, the core goes back to
where the session was (``store_back``) and resolves every action without an outcome from
the journal: nothing is lost and nothing runs twice.

A Controller that starts on such a store (its predecessor was killed while the disk was
full, or the program reopened then) cannot claim the log: it waits the same way, keeps
what arrives for its core, and its probe boots it once the store takes writes. Before,
its boot failed again and again until its supervisor gave up on it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from ..config.settings import settings
from ..exceptions import StoreUnavailable
from ..messages.protocol import Refusal, Refused, StoreFault, UserCommand
from ..messages.tree import Relay
from .base import TrouperActor

logger = logging.getLogger(__name__)


class StoreFaultMode(TrouperActor):
    """Mixed into the Controller, whose state and boot it uses (``store``, ``owner``,
    ``masker``, ``core``, ``core_up``, ``replies``, ``fresh_core``, ``perform``,
    ``_claim_and_begin``, ``_answered``)."""

    store: Any
    owner: Any
    masker: Any
    core: Any
    core_up: bool
    replies: dict[str, Any]
    session_id: str

    store_fault: StoreUnavailable | None
    fault_since: datetime | None

    def fresh_core(self) -> Any:
        raise NotImplementedError  # the Controller's: a core rebuilt from the whole log

    def perform(self, effects: list[Any]) -> None:
        raise NotImplementedError  # the Controller's

    def _claim_and_begin(self) -> None:
        raise NotImplementedError  # the Controller's: the boot's writes

    def _answered(self, answer: Any, reply_to: Any) -> None:
        raise NotImplementedError  # the Controller's: an answer, through the parent

    def store_failed(self, fault: StoreUnavailable, msg: Any) -> None:
        self._refuse_while_faulted(msg, fault)
        if self.store_fault is not None:
            return  # already waiting for the store; what arrived is dropped (see module doc)
        self.store_fault, self.fault_since = fault, datetime.now(UTC)
        logger.error("session %s: cannot record anything: %s; waiting for the store",
                     self.session_id, fault.cause)
        self.send(self._parent_address, StoreFault(
            session_id=self.session_id, cause=fault.cause, since=self.fault_since))
        first = settings().store_probe_first_s
        self.after(first, "store_probe", first)

    def _refuse_while_faulted(self, msg: Any, fault: StoreUnavailable) -> None:
        if isinstance(msg, Relay) and isinstance(msg.msg, UserCommand):
            self.replies.pop(msg.msg.request_id, None)
            self._answered(Refused(
                request_id=msg.msg.request_id, session_id=self.session_id,
                error=Refusal.INVALID_REQUEST,
                message=f"the session cannot record anything now: {fault.cause}"),
                msg.reply_to)

    def on_timer_store_probe(self, delay_s: float) -> None:
        if self.store is None or self.store_fault is None:
            return  # a probe of a fault already over
        if not self.core_up:  # the boot could not write: boot again
            since, self.store_fault = self.fault_since, None  # what came early goes on
            try:
                self._claim_and_begin()
            except StoreUnavailable as still:
                self.fault_since = since
                self._probe_again(still, delay_s)
                return
            self._store_back()
            return
        self.core = self.fresh_core()  # the core ran ahead of the log when the write failed
        since = self.fault_since or datetime.now(UTC)
        try:  # the fault's record, as the core's table makes it (ERROR, then back)
            self.perform(self.core.store_fault(self.store_fault.cause, since,
                                               datetime.now(UTC)))
        except StoreUnavailable as still:
            self._probe_again(still, delay_s)
            return
        self._store_back()
        self.perform(self.core.store_back(datetime.now(UTC)))

    def _probe_again(self, still: StoreUnavailable, delay_s: float) -> None:
        self.store_fault = still
        later = min(settings().store_probe_max_s, delay_s * 2)
        self.after(later, "store_probe", later)

    def _store_back(self) -> None:
        logger.warning("session %s: the store takes writes again; carrying on",
                       self.session_id)
        self.store_fault, self.fault_since = None, None
        self.send(self._parent_address, StoreFault(session_id=self.session_id, cause=None))
