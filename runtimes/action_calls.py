"""``ActionCalls``: the ``Runtime`` half every sandbox client shares: execute an action once
by its id, resolve one from the journal, long-poll while it runs, read the record.

A client (``client.SandboxClient`` for the local sandbox server, ``remote.RemoteSandbox``
for a runtime server) subclasses it and supplies the transport: two requests, and where
they go. Everything the journal contract promises (``runtimes/base.py``) is kept here:

- ``execute`` sends the action with the client's epoch (a server holding a newer one
  refuses it: ``StaleEpoch``), waits on the first answer up to ``poll_s``, then long-polls
  in turns of at most ``poll_s`` until the action's outcome comes or its hard timeout plus
  ``STOP_MARGIN_S`` has passed (``SandboxUnavailable``, ``timed_out``). Sending it again
  never runs it twice: the server answers from its journal.
- An action whose JSON is over the server's body limit is not sent: its outcome is
  ``rejected``, with what to do instead (the server would refuse it unread).
- A journal state ``unknown`` (the action started in a sandbox that has since restarted)
  is the outcome ``lost``.
- ``resolve`` runs nothing: ``absent``, ``running`` (still, after ``wait_s``),
  ``finished`` with the outcome, or ``unknown``.

Every failure is raised through ``call_failures`` (one table for both clients).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..messages.actions import RuntimeAction
from ..messages.causes import RuntimeFailure
from ..messages.outcomes import Outcome
from .base import JournalRecord
from .call_failures import SandboxUnavailable, bad_answer
from .sandbox import MAX_BODY_BYTES

if TYPE_CHECKING:  # messages.checkpoints reads the sandbox's defaults: no cycle at run time
    from ..messages.checkpoints import CheckpointPolicy

STOP_MARGIN_S = 60.0
"""Time past an action's hard timeout allowed for the kill, a shell restart and the reply."""
_OUTCOME_FIELDS = frozenset(Outcome.model_fields)


class ActionCalls(ABC):
    """``execute`` and ``resolve`` over a sandbox server's journal; see the module doc."""

    epoch: int | None
    """The epoch sent with every request (``None``: the client claimed none)."""
    poll_s: float
    """Longest single long-poll while waiting for an action."""
    request_timeout_s: float
    """Limit for one request, on top of the time the server is asked to wait."""
    max_body_bytes: int = MAX_BODY_BYTES
    """The largest request body the server takes."""
    clock: Callable[[], float] = staticmethod(time.monotonic)
    """Seconds, monotonic (a test gives its own)."""

    @property
    @abstractmethod
    def where(self) -> str:
        """The server, as an error message names it (``the sandbox at 127.0.0.1:5001``)."""

    @abstractmethod
    def _send_action(self, body: dict[str, Any], *, timeout_s: float,
                     operation: str) -> dict[str, Any]:
        """Start the action ``body`` describes; the server's answer (its journal record,
        after waiting up to ``body["wait_s"]`` for the outcome)."""

    @abstractmethod
    def _fetch_record(self, action_id: str, wait_s: float, *, timeout_s: float,
                      operation: str) -> dict[str, Any]:
        """What the journal holds for ``action_id``, the server waiting up to ``wait_s``
        while it runs; the request's own limit is ``timeout_s``."""

    def execute(self, action_id: str, action: RuntimeAction, *, timeout_s: float,
                no_output_timeout_s: float, checkpoint: CheckpointPolicy | None = None
                ) -> Outcome:
        """Run ``action`` once (idempotent by ``action_id``) and return its outcome."""
        limit_s = (getattr(action, "timeout_s", None) or timeout_s) + STOP_MARGIN_S
        deadline = self.clock() + limit_s
        body = {"action_id": action_id, "epoch": self.epoch,
                "action": action.model_dump(mode="json"), "timeout_s": timeout_s,
                "no_output_timeout_s": no_output_timeout_s,
                "wait_s": min(self.poll_s, limit_s)}
        if checkpoint is not None:  # a snapshot once it ended, within these limits
            body["checkpoint"] = checkpoint.limits()
        size = len(json.dumps(body).encode("utf-8"))
        if size > self.max_body_bytes:
            return too_large(size, self.max_body_bytes)
        operation = f"execute {action_id}"
        answer = self._send_action(body, operation=operation,
                                   timeout_s=body["wait_s"] + self.request_timeout_s)
        while answer.get("state") == "running":
            remaining_s = deadline - self.clock()
            if remaining_s <= 0:
                raise SandboxUnavailable(
                    f"{operation}: no outcome from {self.where} within {limit_s:g} s (its "
                    f"timeout plus {STOP_MARGIN_S:g} s)", RuntimeFailure.TIMED_OUT)
            answer = self._poll(action_id, min(self.poll_s, remaining_s), operation)
        record = self._record(answer, operation)
        return record.outcome or self._lost(record, operation)

    def resolve(self, action_id: str, *, wait_s: float = 0.0) -> JournalRecord:
        """What the journal knows of ``action_id``, waiting up to ``wait_s`` while it runs."""
        deadline = self.clock() + wait_s
        operation = f"resolve {action_id}"
        answer = self._poll(action_id, min(self.poll_s, wait_s), operation)
        while answer.get("state") == "running" and self.clock() < deadline:
            answer = self._poll(action_id, min(self.poll_s, deadline - self.clock()),
                                operation)
        return self._record(answer, operation)

    def _poll(self, action_id: str, wait_s: float, operation: str) -> dict[str, Any]:
        wait_s = max(0.0, wait_s)
        return self._fetch_record(action_id, wait_s, operation=operation,
                                  timeout_s=wait_s + self.request_timeout_s)

    def _record(self, answer: dict[str, Any], operation: str) -> JournalRecord:
        """The ``JournalRecord`` of a server's answer (``failed`` when it is not one)."""
        try:
            outcome = answer.get("outcome")
            return JournalRecord(
                action_id=answer["action_id"], state=answer["state"],
                epoch=int(answer.get("epoch") or 0),
                outcome=_outcome(outcome, answer.get("epoch")) if outcome is not None else None)
        except (KeyError, ValueError, TypeError, AttributeError) as e:  # pydantic's: ValueError
            raise bad_answer(self.where, operation, f"sent a bad record: {answer!r:.500}") from e

    def _lost(self, record: JournalRecord, operation: str) -> Outcome:
        if record.state == "unknown":
            return LOST
        raise bad_answer(self.where, operation,
                         f"answered the journal state {record.state!r} to an execute")


LOST = Outcome(status="lost", content=(
    "This action started in a sandbox that has since restarted; nobody can know how it "
    "ended, so it is not run again."))
"""The outcome of an action the journal reads ``unknown``."""


def too_large(size: int, limit: int) -> Outcome:
    """The outcome of an action not sent: its JSON is over the server's body limit."""
    return Outcome(status="rejected", content=(
        f"This action was not run: it is too large to send to the sandbox ({size} bytes as "
        f"JSON, limit {limit}). Write a large file in parts (several smaller write_file or "
        "edit_file calls), or generate it with run."))


def _outcome(data: dict[str, Any], epoch: Any = None) -> Outcome:
    """The outcome of a record, ignoring fields this version does not know; it names the
    record's ``epoch`` (the proxy that started the action) where the sandbox did not."""
    known = {k: v for k, v in data.items() if k in _OUTCOME_FIELDS}
    if known.get("epoch") is None and epoch is not None:
        known["epoch"] = epoch
    return Outcome.model_validate(known)
