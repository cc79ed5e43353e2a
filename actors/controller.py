"""Controller: the actor that runs one session's core and performs what it asks.

The session's logic lives in ``core.session.SessionCore`` (no Thespian, no I/O). This
actor turns messages into the core's inputs, performs the effects the core returns, in
order (append to the log, ask the broker, send an action to the runtime, start a timer,
answer a user) and owns the session's log: it is its only writer (claimed with a lease).
An append that fails stops the effects there, so nothing happens whose record is not
durable (I2 in docs/promises.md). A restarted Controller builds a fresh core from the log (I3).

A write the store cannot take (a full disk) puts it in store-fault mode
(``actors/store_fault.py``).
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from thespian.actors import ActorAddress, ActorExitRequest

from ..agent.prompt import load_workspace_instructions
from ..core.effects import (
    Answer,
    Append,
    AskJournal,
    AskModel,
    BrokerBack,
    CancelModel,
    Effect,
    EndSandbox,
    ReadInstructions,
    RestartRuntime,
    RunAction,
    RuntimeDown,
    RuntimeReplaced,
    SandboxEnded,
    StartTimer,
    TimerFired,
)
from ..core.fold import SessionView
from ..core.session import SessionCore
from ..exceptions import LeaseLost, StoreUnavailable
from ..home.paths import Home
from ..llm.history import HistorySender
from ..messages import tree as wiring
from ..messages.protocol import (
    Accepted,
    CancelCompletion,
    Completed,
    CompletionFailed,
    Executed,
    JournalFault,
    Refusal,
    Refused,
    ResendHistory,
    ResolveAction,
    Resolved,
    RetryScheduled,
    RuntimeFailed,
    RuntimeProgress,
    RuntimeReady,
    SandboxClosed,
    StartSession,
    UserCommand,
)
from ..messages.tree import (
    BootController,
    CommandAnswered,
    DowntimeRecorded,
    RecordDowntime,
    Relay,
    Rewire,
    RuntimeGaveUp,
    Superseded,
)
from ..observability import metrics
from ..observability.tracing import TurnTraces, flush_at_exit
from ..security.masking import SecretMasker, mask_known, remember_secrets, session_maskers
from ..store import EventStore, open_store
from .loop_watch import LoopWatch
from .standing_down import SettledStandDown
from .store_fault import StoreFaultMode

logger = logging.getLogger(__name__)



def utc_now() -> datetime:
    return datetime.now(UTC)


class Controller(StoreFaultMode, LoopWatch, SettledStandDown):
    role = "controller"

    def __init__(self) -> None:
        super().__init__()
        self.core: SessionCore | None = None
        self.store: EventStore | None = None
        self.start: StartSession | None = None
        self.broker: ActorAddress | None = None
        self.runtime: ActorAddress | None = None
        self.owner: int | None = None
        self.masker = SecretMasker({})
        """Every value to keep out of the log, the prompt and the logs: the user's secrets
        and the credentials trouper holds (the LLM key among them)."""
        self.revealer = SecretMasker({})
        """Only the user's sandbox secrets: the placeholders an action may use. Never the
        masker above, or a model writing ``<secret:LLM_API_KEY>`` would get the key."""
        self.store_fault: StoreUnavailable | None = None
        """Set while the store takes no write (``actors/store_fault.py``)."""
        self.fault_since: datetime | None = None
        self.replies: dict[str, ActorAddress | None] = {}
        """Who waits for the answer to each user command the core is handling."""
        self.history = HistorySender(uuid.uuid4().hex[:12])
        """What the broker has of this session's history (each request sends what is new)."""
        self.early: list[tuple[Any, ActorAddress]] = []
        """What came before the boot (Thespian may deliver a parent's later messages to a
        new child first), or while a full disk holds the boot back: handled once the core
        is up, in order."""
        self.boot_reply_to: ActorAddress | None = None
        """Who the boot answers once the core is up."""
        self.core_up = False
        """The boot's writes are done (False while a full disk holds them back)."""
        self.turns = TurnTraces()
        """The open turn's span (one trace per turn) when tracing is on."""

    @property
    def session_id(self) -> str:
        return self.start.session_id if self.start else ""

    @property
    def view(self) -> SessionView:
        return self.core.view if self.core is not None else SessionView()

    # -- boot and restore ------------------------------------------------------------

    def on_boot_controller(self, msg: BootController, sender: ActorAddress) -> None:
        self.set_parent(sender)
        self.start, self.broker, self.runtime = msg.start, msg.broker, msg.runtime
        self.masker, self.revealer = session_maskers(msg.start.secrets, msg.start.config.llm,
                                    msg.start.config.runtime)
        remember_secrets(self.masker.pairs)  # this process's log records are masked too
        home = Home.at(msg.start.home)
        self.publish_pid(home.actor_pid_path("controller", msg.start.session_id))
        self.boot_reply_to = msg.reply_to
        if msg.start.restore:
            self.restored_grace()
        self.store = open_store(msg.start.store_url)
        # on a store that takes no writes (a full disk) this raises StoreUnavailable: the
        # Controller waits in store-fault mode and its probe boots it (no restart loop)
        self._claim_and_begin()

    def _claim_and_begin(self) -> None:
        """Own the log and build the core from it: the boot's writes."""
        assert self.store is not None
        self.owner = self.store.claim_owner(self.session_id)
        self.core = self.fresh_core()
        self.perform(self.core.begin(utc_now()))
        self.core_up = True
        logger.info("session %s: controller up at seq %d, state %s, %d pending",
                    self.session_id, self.view.last_seq, self.view.state.value,
                    len(self.view.pending))
        self.booted_up()

    def booted_up(self) -> None:
        """The core is up: answer the boot's ``reply_to`` and handle what came early."""
        if self.boot_reply_to is not None and self.start is not None:
            self.send(self.boot_reply_to, Accepted(request_id=self.start.request_id,
                                                   session_id=self.session_id,
                                                   seq=self.view.last_seq))
        early, self.early = self.early, []
        for held, held_sender in early:
            self._dispatch_own(held, held_sender)

    def on_record_downtime(self, msg: RecordDowntime, sender: ActorAddress) -> None:
        """A stand-in's whole life: its supervisor gave up on the agent loop. As the log's
        only writer it records what the core's table makes of that (ERROR, unless the
        session is over), answers, exits."""
        session_id, error = msg.start.session_id, ""
        masker, _ = session_maskers(msg.start.secrets, msg.start.config.llm,
                                    msg.start.config.runtime)
        try:
            store = open_store(msg.start.store_url)
            try:
                owner = store.claim_owner(session_id)
                core = SessionCore(session_id, msg.start.config, masker=masker)
                core.restore(store.read(session_id))
                for effect in core.loop_down(msg.reason, msg.resumes_at, utc_now()):
                    if isinstance(effect, Append):  # the only effect it has
                        store.append(session_id, list(effect.events), owner=owner)
            finally:
                store.close()
        except Exception as exc:  # noqa: BLE001 - the store's trouble: said to the supervisor
            error = masker.mask_text(f"{type(exc).__name__}: {exc}")
        self.send(sender, DowntimeRecorded(session_id=session_id, error=error))
        self.send(self.myAddress, ActorExitRequest())

    def fresh_core(self) -> SessionCore:
        """A core rebuilt from the whole log; what was in flight is asked of the journal.
        What only this actor knows (is there a broker, a runtime) carries over."""
        assert self.start is not None and self.store is not None
        config = self.start.config
        core = SessionCore(
            self.session_id, config, masker=self.masker, revealer=self.revealer,
            instructions=load_workspace_instructions(Path(config.workspace)))
        core.restore(self.store.read(self.session_id))
        old = self.core
        if old is not None:
            core.runtime_ready, core.runtime_down = old.runtime_ready, old.runtime_down
            core.lift_token = old.lift_token  # a timer of the old core never matches
        return core

    def fail(self, reason: str, exc: BaseException | None = None, tb: str = "") -> None:
        """Exit on purpose; the reason and traceback go to the supervisor masked (it does
        not know this session's values, and records the reason in the log)."""
        super().fail(mask_known(reason), exc, mask_known(tb))

    def on_exit_request(self, msg: ActorExitRequest, sender: ActorAddress) -> None:
        super().on_exit_request(msg, sender)
        flush_at_exit()  # now: once its parent hears it is gone, it may be killed

    # -- inputs --------------------------------------------------------------------------

    def feed(self, msg: Any) -> None:
        """Hand one input to the core and perform what it answers."""
        if self.core is None:
            self.drop(msg, "it came before the boot", logging.WARNING)
            return
        if self.store_fault is not None:
            return  # only the probe writes until the store is back (store-fault mode)
        self.perform(self.core.handle(msg, utc_now()))

    CORE_INPUTS = (RuntimeReady, RuntimeFailed, RuntimeProgress, Executed, Resolved,
                   JournalFault, Completed, RetryScheduled, CompletionFailed)
    """Messages that go to the core as they are (dispatched by type)."""

    MAX_EARLY = 256
    """Inputs kept before the boot at most; later ones are dropped (a flood, not a race)."""

    FIRST: tuple[type, ...] = (BootController, RecordDowntime)
    """What may come first: the boot, or a stand-in's first and only message."""

    def _dispatch_own(self, msg: Any, sender: ActorAddress) -> None:
        if self.store_fault is not None and isinstance(msg, Relay) \
                and isinstance(msg.msg, UserCommand):
            self._refuse_while_faulted(msg, self.store_fault)  # at once: the store decides
            return
        waiting = not self.booted or (not self.core_up and self.store_fault is not None)
        if waiting and not self._stopping and not isinstance(msg, self.FIRST):
            if len(self.early) < self.MAX_EARLY:
                self.early.append((msg, sender))
            else:
                self.drop(msg, "it came before the boot, past the ones kept", logging.WARNING)
            return
        if isinstance(msg, self.CORE_INPUTS):
            self.feed(msg)
        else:
            super()._dispatch_own(msg, sender)

    def on_runtime_gave_up(self, msg: RuntimeGaveUp, sender: ActorAddress) -> None:
        self.feed(RuntimeDown(reason=msg.reason, resumes_at=msg.resumes_at))

    def on_rewire(self, msg: Rewire, sender: ActorAddress) -> None:
        if msg.broker is not None:
            self.broker = msg.broker
            self.history.forget()  # a new broker has nothing of it
            self.feed(BrokerBack())
        if msg.runtime is not None:
            self.runtime = msg.runtime
            self.feed(RuntimeReplaced())

    def on_sandbox_closed(self, msg: SandboxClosed, sender: ActorAddress) -> None:
        """The sandbox an ``EndSandbox`` asked to end is ended (from the parent)."""
        if self.from_parent(msg, sender, "who ends the sandbox"):
            self.feed(SandboxEnded())

    def on_resend_history(self, msg: ResendHistory, sender: ActorAddress) -> None:
        """The broker lacks the history a request built on: send the request whole, if it
        is still the one the core waits for (a stale one is dropped)."""
        request = self.core.llm_request if self.core is not None else None
        if request is None or request.request_id != msg.request_id or self.broker is None:
            self.drop(msg, "not the request the session waits for")
            return
        self.history.forget()
        self.send(self.broker, self.turns.carry(self.history.prepare(request)))

    def on_timer_lift(self, token: int) -> None:
        self.feed(TimerFired("lift", token))

    def on_relay(self, msg: Relay, sender: ActorAddress) -> None:
        inner: Any = msg.msg
        if not isinstance(inner, UserCommand):
            logger.warning("controller: cannot relay %s", type(inner).__name__)
            return
        self.relays_seen += 1
        self.replies[inner.request_id] = msg.reply_to
        self.feed(inner)

    # -- effects -------------------------------------------------------------------------

    def perform(self, effects: list[Effect]) -> None:
        for effect in effects:
            self._perform(effect)
        self.tell_working()
        self.consider_standing_down()
        self.turns.after(self.view)  # a settled session ends it

    def _perform(self, effect: Effect) -> None:  # noqa: C901 - one branch per effect kind
        if isinstance(effect, Append):
            self._append(effect)
        elif isinstance(effect, AskModel):
            if self.broker is not None:  # else held: BrokerBack sends it to the new one
                self.send(self.broker, self.turns.asked(self.history.prepare(
                    effect.request), self.session_id))
                self.watch_model_call(effect.request.request_id)
        elif isinstance(effect, CancelModel):
            if self.broker is not None:
                self.send(self.broker, CancelCompletion(request_id=effect.request_id,
                                                        session_id=self.session_id))
        elif isinstance(effect, RunAction):
            self.send(self.runtime, self.turns.carry(effect.request))
        elif isinstance(effect, AskJournal):
            self.turns.event("journal.resolve", self.session_id,
                             {"trouper.action_id": effect.action_id})
            self.send(self.runtime, ResolveAction(session_id=self.session_id,
                                                  action_id=effect.action_id))
        elif isinstance(effect, StartTimer):
            self.after(effect.delay_s, effect.name, effect.token)
        elif isinstance(effect, RestartRuntime):
            self.send(self._parent_address, wiring.RestartRuntime(reason=effect.reason))
        elif isinstance(effect, EndSandbox):  # its supervisor owns the proxy's lifecycle
            self.send(self._parent_address, wiring.EndSandbox(reason=effect.reason))
        elif isinstance(effect, Answer):
            self._answer(effect)
        elif isinstance(effect, ReadInstructions) and self.core is not None:
            assert self.start is not None
            self.core.set_instructions(
                load_workspace_instructions(Path(self.start.config.workspace)))

    def _append(self, effect: Append) -> None:
        """Durable before anything after it; the store raises StoreUnavailable (a state:
        store-fault mode) or LeaseLost (another Controller owns the log)."""
        assert self.store is not None
        try:
            stored = self.store.append(self.session_id, list(effect.events), owner=self.owner)
            metrics.logged(self.start, stored)  # counted once, when durable
            self.turns.logged(stored, self.session_id)  # restarts and failures, on the turn
        except LeaseLost as exc:
            self.send(self._parent_address, Superseded(session_id=self.session_id,
                                                       reason=str(exc)))
            raise
        expected = [event.seq for event in effect.events]
        if [event.seq for event in stored] != expected:  # a second writer: rebuild from it
            logger.error("session %s: the log has seqs %s where the core expected %s; "
                         "rebuilding from the log", self.session_id,
                         [event.seq for event in stored], expected)
            self.core = self.fresh_core()

    def _answer(self, effect: Answer) -> None:
        if effect.request_id not in self.replies:
            return
        reply_to = self.replies.pop(effect.request_id)
        if effect.error is None:
            answer: Any = Accepted(request_id=effect.request_id, session_id=self.session_id,
                                   seq=effect.seq)
        else:
            answer = Refused(request_id=effect.request_id, session_id=self.session_id,
                             error=Refusal.INVALID_REQUEST, message=effect.error)
        self._answered(answer, reply_to)

    def _answered(self, answer: Accepted | Refused, reply_to: ActorAddress | None) -> None:
        """Answer through the parent, which holds the command for a successor until it
        passes the answer on (``actors/in_flight.py``). Answered straight to ``reply_to``,
        a kill between the parent's word and the answer lost the answer with the command
        let go of."""
        parent = getattr(self, "_parent_address", None)
        if parent is not None:
            self.send(parent, CommandAnswered(session_id=self.session_id,
                                              request_id=answer.request_id, answer=answer,
                                              reply_to=reply_to))
        elif reply_to is not None:
            self.send(reply_to, answer)
