"""Replaying a recorded session against today's code and tools, and where it diverges.

``replay_session(client, session_id)`` plays the session's model replies again
(``Script.from_session``) from a ``FakeLLMServer``, in a NEW session with the original's
task and config (its model replaced by the fake server; the summary model too, as the
script holds every summary) in the workspace the caller gives, as given: nothing of
the original's workspace is copied. The user's later messages are sent again, in order,
each once the replay has settled; an action that waits for approval is approved or
rejected as the action at the same place was. Then each action's outcome is compared
with the recorded one's, in order: the first that differs is the divergence.

What is compared: the tool and its raw arguments, then the outcome's status, exit code,
hard/soft timeout, and content. What is normalised in the content first, as it differs
between runs by nature: both sessions' workspace paths (as configured and resolved) read
``<workspace>``, both session ids ``<session>``, each action's own id ``<action>`` (the
name of its full-output file), and durations (``12 s``, ``0.3s``, ``40ms``) ``<duration>``.
The outcome's ``duration_s`` and ``checkpoint`` are not compared.

    >>> from trouper import Trouper                               # doctest: +SKIP
    >>> with Trouper() as t:                                      # doctest: +SKIP
    ...     report = replay_session(t, "s-1234", workspace="/tmp/fresh")
    ...     print(report.text())
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ..exceptions import InvalidRequest
from ..messages.events import (
    ActionEvent,
    AgentState,
    ConfirmationEvent,
    MessageEvent,
    ObservationEvent,
)
from .fake_llm import FakeLLMServer
from .script import Script

if TYPE_CHECKING:
    from ..client.protocol import SessionHandle, TrouperClient
    from ..config.models import RuntimeConfig, SessionConfig

REPLAY_MODEL = "hosted_vllm/replay"
REPLAY_KEY = "trouper-replay-key"
"""The fake server's API key: masked wherever it appears, so a word no output holds."""
DEFAULT_TIMEOUT_S = 600.0
"""How long a replay may take, all of it, before it is stopped and reported unfinished."""
SHOWN_CHARS = 2000
"""How much of each side's content ``text()`` shows (``--json`` has all of it)."""
_DURATION = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|s)\b")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class ReplayedAction(_Model):
    """One action of a log, with its outcome as recorded there."""

    index: int
    """Its place among the log's actions (setup steps included), from 0."""
    seq: int
    """The seq of its ``ActionEvent`` in its own log."""
    outcome_seq: int | None
    """The seq of its ``ObservationEvent``; None when it has no outcome."""
    action_id: str
    source: str
    """``agent``, or ``environment`` for a setup step."""
    tool: str
    arguments: str
    """The raw arguments string, as the model sent it."""
    status: str | None
    """The outcome's status; None when the log holds no outcome for it."""
    exit_code: int | None = None
    timed_out: str | None = None
    content: str | None = None
    """The content as recorded (not normalised)."""

    def describe(self) -> str:
        """``ok, exit 0`` / ``error`` / ``no outcome``."""
        if self.status is None:
            return "no outcome"
        parts = [self.status]
        if self.exit_code is not None:
            parts.append(f"exit {self.exit_code}")
        if self.timed_out:
            parts.append(f"{self.timed_out} timeout")
        return ", ".join(parts)


class Divergence(_Model):
    """The first action whose replay differs from the record, with both sides."""

    index: int
    """The action's place in both logs (actions are paired by place), from 0."""
    differs: tuple[str, ...]
    """What differs: ``tool``, ``arguments``, ``status``, ``exit_code``, ``timed_out``,
    ``content``; or ``missing`` when one log has no action at this place."""
    recorded: ReplayedAction | None
    """None when the replay went further than the record."""
    replayed: ReplayedAction | None
    """None when the replay took no action at this place."""


class ReplayReport(_Model):
    """What a replay did and where, if anywhere, it went another way than the record."""

    session_id: str
    replay_session_id: str
    workspace: str
    """The replay's workspace."""
    steps: int
    """Model replies played (the script's steps)."""
    recorded_actions: int
    replayed_actions: int
    matched: int
    """Actions whose outcomes matched, before the divergence if there is one."""
    recorded_state: str
    replayed_state: str
    settled: bool
    """False: the replay did not settle in time and was stopped (compared as it was)."""
    messages_sent: int
    """The later user messages sent to the replay (the task not counted)."""
    divergence: Divergence | None
    notes: tuple[str, ...] = ()

    @property
    def diverged(self) -> bool:
        return self.divergence is not None

    def text(self) -> str:
        """The report for a person, several lines."""
        lines = [f"replay of {self.session_id} as {self.replay_session_id} in {self.workspace}",
                 f"{self.steps} model replies played; actions: {self.recorded_actions} "
                 f"recorded, {self.replayed_actions} replayed; state: {self.recorded_state} "
                 f"recorded, {self.replayed_state} replayed"]
        lines += [f"note: {note}" for note in self.notes]
        d = self.divergence
        if d is None:
            lines.append(f"no divergence: all {self.matched} actions had the same outcome")
            return "\n".join(lines)
        seqs = (f"seq {d.recorded.seq if d.recorded else '-'} in {self.session_id}, "
                f"seq {d.replayed.seq if d.replayed else '-'} in {self.replay_session_id}")
        lines.append(f"diverged at action {d.index} (counted from 0; {seqs}), after "
                     f"{self.matched} matching: {', '.join(d.differs)}")
        for side, action in (("recorded", d.recorded), ("replayed", d.replayed)):
            lines.append(f"  {side}:")
            if action is None:
                lines.append("    (no action at this place)")
                continue
            lines.append(f"    {action.source} {action.tool} {action.arguments}")
            lines.append(f"    outcome: {action.describe()}")
            content = action.content or ""
            cut = content[:SHOWN_CHARS] + (" [...]" if len(content) > SHOWN_CHARS else "")
            lines += [f"    | {line}" for line in cut.splitlines()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def replay_session(client: TrouperClient, session_id: str, *,
                   workspace: str | os.PathLike[str] | None = None,
                   secrets: Mapping[str, str] | None = None,
                   runtime: RuntimeConfig | Mapping[str, Any] | None = None,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> ReplayReport:
    """Replay the stored session ``session_id`` through ``client`` (a ``Trouper`` or the
    daemon's client: one that can start sessions) and compare; see ``replay``."""
    original = client.session(session_id)
    events = list(original.events())
    return replay(client, events, original.info().config, session_id=session_id,
                  workspace=workspace, secrets=secrets, runtime=runtime,
                  timeout_s=timeout_s)


def replay(client: TrouperClient, events: Sequence[Any], config: SessionConfig, *,
           session_id: str, workspace: str | os.PathLike[str] | None = None,
           secrets: Mapping[str, str] | None = None,
           runtime: RuntimeConfig | Mapping[str, Any] | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> ReplayReport:
    """Play the model replies of ``events`` (the log of ``session_id``, whose config is
    ``config``) in a new session, and compare its actions' outcomes with the recorded ones.

    ``workspace``: the replay's folder, used as it is (empty, or a copy the caller made of
    what the original started from); None: a new empty one under the home. ``secrets``:
    the values of the config's ``secret_names`` (stored only in the original's secrets
    file). ``runtime``: where the replay's sandbox runs; None: the original's (a remote
    runtime's token is not stored in the config: pass it here). ``timeout_s``: the whole
    replay's limit, after which it is stopped and compared as it stands.

    Raises:
        ScriptError: the log has a model call without its reply.
        ConfigError, InvalidRequest: the new session is refused (as ``start_session``).
    """
    from ..config.checks import OPTIONS

    script = Script.from_session(events)
    task, later = _user_messages(events, config.task)
    options = {name: getattr(config, name) for name in OPTIONS}
    options["summary_model"] = None  # the script holds every summary, at its place
    recorded = actions_of(events)
    notes: list[str] = []
    with FakeLLMServer(script) as server:
        session = client.start_session(
            task, llm=server.llm(REPLAY_MODEL, api_key=REPLAY_KEY),
            runtime=config.runtime if runtime is None else runtime,
            workspace=workspace, secrets=secrets, **options)
        settled, sent = _drive(session, later, _decisions(events, recorded), timeout_s, notes)
        replayed_events = list(session.events())
        replay_config = session.info().config
    replayed = actions_of(replayed_events)
    paths = _paths(config.workspace, replay_config.workspace)
    ids = (session_id, session.id)
    matched, divergence = compare(recorded, replayed, paths, ids)
    recorded_state = _last_state(events)
    replayed_state = _last_state(replayed_events)
    if recorded_state != replayed_state:
        notes.append(f"the replay ended {replayed_state}, the record {recorded_state}")
    if len(later) > sent:
        notes.append(f"{len(later) - sent} later user message(s) not sent: the replay "
                     "did not settle where the record had them")
    return ReplayReport(
        session_id=session_id, replay_session_id=session.id,
        workspace=replay_config.workspace, steps=len(script.steps),
        recorded_actions=len(recorded), replayed_actions=len(replayed), matched=matched,
        recorded_state=recorded_state, replayed_state=replayed_state, settled=settled,
        messages_sent=sent, divergence=divergence, notes=tuple(notes))


def actions_of(events: Iterable[Any]) -> list[ReplayedAction]:
    """Every action of a log in order (setup steps included), each with its outcome."""
    log = list(events)
    outcomes = {e.action_id: e for e in log if isinstance(e, ObservationEvent)}
    actions = [e for e in log if isinstance(e, ActionEvent)]
    found = []
    for index, action in enumerate(actions):
        seen = outcomes.get(action.action_id)
        outcome = seen.outcome if seen is not None else None
        found.append(ReplayedAction(
            index=index, seq=action.seq, outcome_seq=seen.seq if seen else None,
            action_id=action.action_id, source=action.source, tool=action.tool,
            arguments=action.arguments, status=outcome.status if outcome else None,
            exit_code=outcome.exit_code if outcome else None,
            timed_out=outcome.timed_out if outcome else None,
            content=outcome.content if outcome else None))
    return found


def compare(recorded: Sequence[ReplayedAction], replayed: Sequence[ReplayedAction],
            workspaces: Sequence[str], session_ids: Sequence[str]
            ) -> tuple[int, Divergence | None]:
    """The actions that matched before the first that differs, and that one (None: all
    matched and both logs have as many)."""
    for index in range(max(len(recorded), len(replayed))):
        old = recorded[index] if index < len(recorded) else None
        new = replayed[index] if index < len(replayed) else None
        if old is None or new is None:
            return index, Divergence(index=index, differs=("missing",), recorded=old,
                                     replayed=new)
        differs = tuple(name for name in ("tool", "arguments", "status", "exit_code",
                                          "timed_out")
                        if getattr(old, name) != getattr(new, name))
        if _normalised(old, workspaces, session_ids) != _normalised(new, workspaces,
                                                                     session_ids):
            differs += ("content",)
        if differs:
            return index, Divergence(index=index, differs=differs, recorded=old, replayed=new)
    return len(recorded), None


def normalise(text: str, workspaces: Sequence[str], session_ids: Sequence[str],
              action_id: str = "") -> str:
    """``text`` with what differs between runs by nature replaced (see the module doc)."""
    for path in sorted(set(workspaces), key=len, reverse=True):
        if path:
            text = text.replace(path, "<workspace>")
    for name, word in ((action_id, "<action>"), *((sid, "<session>") for sid in session_ids)):
        if name:
            text = text.replace(name, word)
    return _DURATION.sub("<duration>", text)


def _normalised(action: ReplayedAction, workspaces: Sequence[str],
                session_ids: Sequence[str]) -> str | None:
    if action.content is None:
        return None
    return normalise(action.content, workspaces, session_ids, action.action_id)


def _paths(*workspaces: str) -> list[str]:
    """Each workspace as configured and resolved (a /tmp that is a symlink shows both)."""
    found = []
    for path in workspaces:
        found += [path, os.path.realpath(path), str(Path(path).resolve())]
    return found


def _user_messages(events: Sequence[Any], fallback: str) -> tuple[str, list[str]]:
    """The task (the first user message; the config's when the log has none) and the
    later user messages, in order."""
    said = [e.text for e in events if isinstance(e, MessageEvent) and e.source == "user"]
    return (said[0], said[1:]) if said else (fallback, [])


def _decisions(events: Sequence[Any], recorded: Sequence[ReplayedAction]
               ) -> dict[int, ConfirmationEvent]:
    """The user's approvals and rejections, by the place of the action they answered."""
    place = {action.action_id: action.index for action in recorded}
    return {place[e.action_id]: e for e in events
            if isinstance(e, ConfirmationEvent) and e.action_id in place}


def _drive(session: SessionHandle, later: list[str], decisions: dict[int, ConfirmationEvent],
           timeout_s: float, notes: list[str]) -> tuple[bool, int]:
    """Run the replay to its end: at each settling, answer an approval as the record did,
    else send the next later message; stop it at the timeout. Returns (settled, sent)."""
    deadline = time.monotonic() + timeout_s
    sent = 0
    while True:
        state = session.wait(timeout=max(0.0, deadline - time.monotonic()))
        if not session.view().settled:
            notes.append(f"the replay did not settle within {timeout_s:g} s: it was stopped "
                         f"in {state.value}")
            session.stop()
            return False, sent
        try:
            if state == AgentState.AWAITING_USER_CONFIRMATION:
                if not _answer(session, decisions, notes):
                    return True, sent
            elif sent < len(later):
                session.send(later[sent])
                sent += 1
            else:
                return True, sent
        except InvalidRequest as e:  # a state the record's input does not fit
            notes.append(f"the replay refused the user's input: {e}")
            return True, sent


def _answer(session: SessionHandle, decisions: dict[int, ConfirmationEvent],
            notes: list[str]) -> bool:
    """Approve or reject the waiting action as the record's action at its place was;
    False (with a note) when the record has no answer for it."""
    waiting = session.awaiting_confirmation
    actions = [e.action_id for e in session.events() if isinstance(e, ActionEvent)]
    index = actions.index(waiting.action_id) if waiting is not None else -1
    decision = decisions.get(index)
    if waiting is None or decision is None:
        notes.append(f"the replay waits for approval of action {index}, which the record "
                     "has no answer for")
        return False
    if decision.approved:
        session.approve(waiting.action_id)
    else:
        session.reject(decision.reason, waiting.action_id)
    return True


def _last_state(events: Sequence[Any]) -> str:
    from ..core.fold import SessionView

    return SessionView.of(events).state.value


__all__ = ["Divergence", "ReplayReport", "ReplayedAction", "actions_of", "compare",
           "normalise", "replay", "replay_session"]
