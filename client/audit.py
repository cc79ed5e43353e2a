"""The audit trail of a session's actions, derived from its log: every attempt of each
action, which sandbox ran it, and what became of it (docs/audit.md).

Nothing is recorded for it: the log already holds each action's intent (``ActionEvent``),
its one outcome (``ObservationEvent``, which names the epoch that started it and the
sandbox server process that ran it), the user's answers (``ConfirmationEvent``) and every
change of sandbox (``RuntimeEvent``). An event a step would write only for the audit
would cost every session a store write a step; reading the log costs only the reader.

The attempts are inferred from the log's order, as the session core dispatches: one
action at a time, the first without an outcome, once the user approved it, while a
sandbox is up. Its first attempt went to the sandbox up then (or the next one to come
up); each sandbox that came up again (``started``/``attached``/``restarted``) while it
had no outcome asked that sandbox's journal about it under the new epoch (and ran it
then only if the journal never saw it). A Controller restarted with the same sandbox
asks the journal too, under the same epoch: the log has no trace of that, nor need of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from ..messages.actions import RUNTIME_KINDS
from ..messages.base import Frozen
from ..messages.events import (
    ActionEvent,
    AgentState,
    ConfirmationEvent,
    Event,
    ObservationEvent,
    RuntimeEvent,
    Source,
    StateChanged,
)
from ..messages.outcomes import Outcome, OutcomeStatus

SUMMARY_CHARS = 200
"""The longest summary of an action's arguments (the log has them whole)."""
CAUSE_CHARS = 200
_READY = frozenset({"started", "attached", "restarted"})
_DOWN = frozenset({"failed", "closed"})
_WHO = {"agent": "the model", "user": "the user", "environment": "setup"}


class Attempt(Frozen):
    """One time the session sent the action to a sandbox, or asked a sandbox's journal
    about it."""

    kind: Literal["dispatch", "resolve"]
    """``dispatch``: sent to be run; ``resolve``: its journal asked, after the sandbox
    came up again (it runs then only if that journal never saw it)."""
    epoch: int | None
    """The runtime epoch the request went under; None when no sandbox came up for it."""
    after_seq: int
    """The event it followed: the action, its approval or the outcome before it (a
    dispatch), the ``RuntimeEvent`` of the sandbox that came up (a resolve)."""
    why: str
    """In words: what led to it."""
    started_it: bool = False
    """This attempt's epoch is the one the sandbox's journal says started the action."""
    server: str | None = None
    """The sandbox server process that ran the action (``pid N, boot B``), where the
    outcome names it and this attempt started it."""


class ActionAudit(Frozen):
    """One action, from its intent to its outcome."""

    seq: int
    """The seq of its ``ActionEvent``."""
    action_id: str
    turn_id: str
    tool: str
    """The tool as the model named it."""
    kind: str | None
    """The parsed action's kind (``run``, ``write_file``...); None for a malformed call."""
    summary: str
    """What it asks, short: the command, the path, the server and tool."""
    source: Source
    """Who asked: ``agent`` (the model), ``user``, ``environment`` (the session's setup)."""
    asked_by: str
    """``source`` in words."""
    attempts: tuple[Attempt, ...] = ()
    outcome_seq: int | None = None
    """The seq of its ``ObservationEvent``; None while it has none (in flight)."""
    status: OutcomeStatus | None = None
    """The outcome's status; None while it has none."""
    cause: str
    """What became of it, in words (ran, ran with exit 2, rejected by the user...)."""
    exit_code: int | None = None
    timed_out: Literal["hard", "soft"] | None = None
    duration_s: float | None = None
    output_chars: int | None = None
    """The output's whole length: what the agent read plus what was cut from it."""
    checkpoint: str | None = None
    """The snapshot of the workspace it left (a fork can start from it)."""
    epoch: int | None = None
    """The epoch that started it, as its sandbox's journal says."""
    server_pid: int | None = None
    boot_id: str | None = None


def audit(events: Iterable[Event]) -> list[ActionAudit]:
    """Every action of a session, in log order, with its attempts and what became of it
    (see the module doc). ``events``: the session's log, in order, whole."""
    log = list(events)
    runtime = [e for e in log if isinstance(e, RuntimeEvent) and (
        e.phase in _READY or e.phase in _DOWN)]
    approved = {e.action_id: e.seq for e in log if isinstance(e, ConfirmationEvent)
                and e.approved}
    refused = {e.action_id: e for e in log if isinstance(e, ConfirmationEvent)
               and not e.approved}
    outcomes = {e.action_id: e for e in log if isinstance(e, ObservationEvent)}
    held = [e.seq for e in log if isinstance(e, StateChanged)
            and e.state == AgentState.AWAITING_USER_CONFIRMATION]
    audits: list[ActionAudit] = []
    turn_free_after = 0
    for action in (e for e in log if isinstance(e, ActionEvent)):
        observed = outcomes.get(action.action_id)
        # one action at a time: this one could go only once every earlier one had its outcome
        dispatch_after = max(action.seq, turn_free_after, approved.get(action.action_id, 0))
        if observed is None and dispatch_after < _END and any(
                seq > dispatch_after for seq in held):  # held for it: its turn, no approval
            dispatch_after = _ASKING
        audits.append(_one(action, observed, dispatch_after, runtime,
                           refused.get(action.action_id)))
        if observed is not None:
            turn_free_after = max(turn_free_after, observed.seq)
        else:
            turn_free_after = max(turn_free_after, _END)
    return audits


_END = 2**63
"""A seq after every event: an action without an outcome holds back every later one."""
_ASKING = _END + 1
"""The action waits for the user's approval: not sent yet."""


def _one(action: ActionEvent, observed: ObservationEvent | None, dispatch_after: int,
         runtime: Sequence[RuntimeEvent], refusal: ConfirmationEvent | None) -> ActionAudit:
    outcome = observed.outcome if observed is not None else None
    kind = action.action.kind if action.action is not None else None
    in_sandbox = kind in RUNTIME_KINDS and not (outcome and outcome.status == "rejected")
    attempts = _attempts(dispatch_after, observed.seq if observed else _END, runtime,
                         outcome) if in_sandbox and dispatch_after < _END else ()
    fields: dict[str, Any] = dict(
        seq=action.seq, action_id=action.action_id, turn_id=action.turn_id, tool=action.tool,
        kind=kind, summary=summary(action), source=action.source,
        asked_by=_WHO.get(action.source, action.source), attempts=attempts)
    if outcome is None or observed is None:
        return ActionAudit(**fields, cause=_pending_cause(kind, attempts, dispatch_after))
    return ActionAudit(
        **fields, outcome_seq=observed.seq, status=outcome.status,
        cause=cause(action, outcome, attempts, refusal, runtime),
        exit_code=outcome.exit_code, timed_out=outcome.timed_out,
        duration_s=outcome.duration_s,
        output_chars=len(outcome.content) + outcome.elided_chars,
        checkpoint=outcome.checkpoint, epoch=outcome.epoch,
        server_pid=outcome.server_pid, boot_id=outcome.boot_id)


def _attempts(after: int, until: int, runtime: Sequence[RuntimeEvent],
              outcome: Outcome | None) -> tuple[Attempt, ...]:
    """The dispatch under the sandbox up at ``after`` (or the next to come up), then a
    resolve under each sandbox that came up again before the outcome (seq ``until``)."""
    before = [e for e in runtime if e.seq <= after]
    later = [e for e in runtime if after < e.seq < until]
    made: list[Attempt] = []
    if before and before[-1].phase in _READY:
        made.append(Attempt(kind="dispatch", epoch=before[-1].epoch, after_seq=after,
                            why="sent to be run"))
    else:
        first_up = next((e for e in later if e.phase in _READY), None)
        if first_up is None:
            return ()  # no sandbox came up for it (yet)
        made.append(Attempt(kind="dispatch", epoch=first_up.epoch, after_seq=first_up.seq,
                            why=f"sent once a sandbox {first_up.phase}"))
        later = [e for e in later if e.seq > first_up.seq]
    went_down: RuntimeEvent | None = None
    for event in later:
        if event.phase in _DOWN:
            went_down = event
            continue
        what = "" if went_down is None else (
            f"the sandbox {went_down.phase}"
            + (f" ({_first_line(went_down.detail)})" if went_down.detail else "") + ", then ")
        made.append(Attempt(kind="resolve", epoch=event.epoch, after_seq=event.seq,
                            why=f"{what}a sandbox {event.phase}: its journal asked"))
        went_down = None
    return tuple(_mark_starter(made, outcome))


def _mark_starter(attempts: list[Attempt], outcome: Outcome | None) -> list[Attempt]:
    """The attempt whose epoch the journal says started the action names its sandbox."""
    if outcome is None or outcome.epoch is None:
        return attempts
    server = server_text(outcome)
    for n, attempt in enumerate(attempts):
        if attempt.epoch == outcome.epoch:
            attempts[n] = attempt.model_copy(update={"started_it": True, "server": server})
            break
    return attempts


def server_text(outcome: Outcome) -> str | None:
    """The sandbox server process an outcome names (``pid 41, boot 7f3a``), or None."""
    parts = [f"pid {outcome.server_pid}"] if outcome.server_pid is not None else []
    parts += [f"boot {outcome.boot_id}"] if outcome.boot_id else []
    return ", ".join(parts) or None


def cause(action: ActionEvent, outcome: Outcome, attempts: Sequence[Attempt],
          refusal: ConfirmationEvent | None, runtime: Sequence[RuntimeEvent]) -> str:
    """What became of an action, in words."""
    first = _first_line(outcome.content)
    kind = action.action.kind if action.action is not None else None
    if outcome.status == "ok":
        if kind not in RUNTIME_KINDS:
            return "answered by the session itself (nothing ran in a sandbox)"
        if outcome.still_running:
            return "ran; still running after a while without output (soft timeout)"
        if outcome.exit_code:
            return f"ran with exit {outcome.exit_code}"
        return "ran"
    if outcome.status == "error":
        if outcome.timed_out == "hard":
            return "timed out hard: it was killed"
        return f"failed: {first}"
    if outcome.status == "rejected":
        if refusal is not None:
            return "rejected by the user" + (f": {_clip(refusal.reason)}" if refusal.reason
                                             else "")
        if action.action is None:
            return f"malformed call, not run: {first}"
        return first if first.lower().startswith("not run") else f"not run: {first}"
    if outcome.status == "interrupted":
        return f"interrupted: {first}"
    return _lost_cause(kind, first, attempts, runtime)


def _lost_cause(kind: str | None, first: str, attempts: Sequence[Attempt],
                runtime: Sequence[RuntimeEvent]) -> str:
    if kind == "mcp":
        return f"lost with its MCP server: {first}"
    if not attempts:
        return f"lost: {first}"
    epoch = attempts[0].epoch
    failed = next((e for e in runtime if e.phase == "failed" and e.seq > attempts[0].after_seq
                   and e.epoch == epoch), None)
    why = f": {_first_line(failed.detail)}" if failed is not None and failed.detail else ""
    return f"lost with its sandbox (epoch {epoch}{why}); not run again"


def _pending_cause(kind: str | None, attempts: Sequence[Attempt], after: int) -> str:
    if after == _ASKING:
        return "waiting for the user's approval"
    if after >= _END:
        return "waiting: an earlier action has no outcome yet"
    if kind not in RUNTIME_KINDS:
        return "not answered yet"
    if not attempts:
        return "waiting for a sandbox"
    return "in flight" if len(attempts) == 1 else (
        f"in flight; asked again under epoch {attempts[-1].epoch}")


def summary(action: ActionEvent) -> str:
    """What an action asks, short: ``$ pytest -x``, ``write_file a.txt``, ``mcp s.tool``."""
    parsed = action.action
    if parsed is None:
        text = f"{action.tool} {action.arguments}"
    elif (command := getattr(parsed, "command", None)) is not None:
        text = f"$ {command}" if command else "$ (wait for more output)"
    elif (path := getattr(parsed, "path", None)) is not None:
        text = f"{parsed.kind} {path}"
    elif parsed.kind == "mcp":
        text = f"mcp {getattr(parsed, 'server', '')}.{getattr(parsed, 'tool', '')}"
    elif parsed.kind == "clone":
        text = f"clone {getattr(parsed, 'url', '')}"
    else:
        text = f"{parsed.kind} {action.arguments}" if parsed.kind != "finish" else "finish"
    return _clip(text, SUMMARY_CHARS)


def _first_line(text: str) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return _clip(line, CAUSE_CHARS)


def _clip(text: str, limit: int = CAUSE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def audit_json(events: Iterable[Event]) -> list[dict[str, object]]:
    """``audit`` as JSON values (the daemon's ``GET /v1/sessions/{id}/actions``)."""
    return [entry.model_dump(mode="json") for entry in audit(events)]


__all__ = ["ActionAudit", "Attempt", "audit", "audit_json", "cause", "server_text",
           "summary"]
