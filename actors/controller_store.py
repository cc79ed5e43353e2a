"""The Controller when its store cannot take a write: ERROR with the cause, no crash loop.

A failed append raises ``StoreUnavailable`` (disk full, read-only, locked, corrupt). The
effects after it are not performed, so nothing runs whose intent is not durable (I2), and
the Controller enters *store-fault mode*: it tells the tree (clients show the cause while
the log cannot hold it), drops what arrives (a model reply is asked again later; a tool's
outcome stays in the sandbox's journal), and probes the store on a growing timer. When a
write goes through again it records the fault, rebuilds its core from the log (as a
restarted Controller would) and resolves every action without an outcome from the
journal: nothing is lost and nothing runs twice.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..exceptions import StoreUnavailable
from ..fold import SessionView
from ..messages.events import AgentState, StateChanged
from ..messages.protocol import Refused, StoreFault, UserCommand
from .wiring import Relay

if TYPE_CHECKING:
    from .controller import Controller

logger = logging.getLogger(__name__)

PROBE_FIRST_S = 0.5
PROBE_MAX_S = 5.0


class StoreFaultMixin:
    """Store-fault mode for the Controller (mixed into it; ``self`` is a Controller)."""

    store_fault: StoreUnavailable | None = None
    fault_since: datetime | None = None

    def store_failed(self: Controller, fault: StoreUnavailable, msg: Any) -> None:
        self._refuse_while_faulted(msg, fault)
        if self.store_fault is not None:
            return  # already waiting for the store; what arrived is dropped (see module doc)
        self.store_fault, self.fault_since = fault, datetime.now(UTC)
        logger.error("session %s: cannot record anything: %s; waiting for the store",
                     self.session_id, fault.cause)
        self.send(self._parent_address, StoreFault(
            session_id=self.session_id, cause=fault.cause, since=self.fault_since))
        self.after(PROBE_FIRST_S, "store_probe", PROBE_FIRST_S)

    def _refuse_while_faulted(self: Controller, msg: Any, fault: StoreUnavailable) -> None:
        if isinstance(msg, Relay) and isinstance(msg.msg, UserCommand):
            self.replies.pop(msg.msg.request_id, None)
            if msg.reply_to is not None:
                self.send(msg.reply_to, Refused(
                    request_id=msg.msg.request_id, session_id=self.session_id,
                    error="InvalidRequest",
                    message=f"the session cannot record anything now: {fault.cause}"))

    def on_timer_store_probe(self: Controller, delay_s: float) -> None:
        if self.store is None or self.store_fault is None:
            return  # a probe of a fault already over
        before = SessionView.of(self.store.read(self.session_id))
        note = StateChanged(
            state=AgentState.ERROR, resumes_at=datetime.now(UTC),
            reason=f"{self.store_fault.cause}; nothing could be recorded from "
                   f"{self.fault_since:%H:%M:%S} UTC until now")
        try:
            self.store.append(self.session_id, [self.masker.mask_event(note)], owner=self.owner)
        except StoreUnavailable as still:
            self.store_fault = still
            self.after(min(PROBE_MAX_S, delay_s * 2), "store_probe", min(PROBE_MAX_S, delay_s * 2))
            return
        logger.warning("session %s: the store takes writes again; carrying on",
                       self.session_id)
        self.store_fault, self.fault_since = None, None
        self.send(self._parent_address, StoreFault(session_id=self.session_id, cause=None))
        self.core = self.fresh_core()  # the core ran ahead of the log when the write failed
        self.perform(self.core.store_back(before, datetime.now(UTC)))
