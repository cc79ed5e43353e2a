"""The default agent's prompt: system prompt, AGENTS.md, and the session log as messages.

The log is folded into litellm ``messages`` (OpenAI chat format). Only conversation
events reach the prompt; status events never do (I4 in docs/promises.md). Each turn's tool results
follow its assistant message straight away, as providers require, and an action
without an outcome yet is left out with its tool call, so the list is always valid.

``PromptBuilder`` is fed events one at a time, so a step costs the same at event 10 and
at event 10,000; ``build_messages`` is the one-shot form:

    >>> from trouper.messages.events import MessageEvent
    >>> [m["role"] for m in build_messages([MessageEvent(source="user", text="hi")])]
    ['system', 'user']
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..messages.events import ActionEvent, Event, MessageEvent, ObservationEvent
from ..messages.outcomes import Outcome

logger = logging.getLogger(__name__)

INSTRUCTIONS_FILE = "AGENTS.md"
"""The file at the workspace root whose text joins the system prompt."""

DEFAULT_SYSTEM_PROMPT = """\
You are a careful software engineer. You work on the user's task in a workspace \
folder, and you act only through your tools:
- run: a command in a persistent bash shell that starts in the workspace; the current \
directory, exported variables and background jobs persist between calls.
- read_file, write_file, edit_file: read, create and change files in the workspace.
- think: write down your reasoning; nothing runs.
- finish: end the task with a short summary for the user.

Long output is truncated to its head and tail; a note says how much was cut and which \
file holds the full text, which you can read with read_file. A command that prints \
nothing for a while hands control back to you while it keeps running: call run with an \
empty command to wait for more of its output, or with interrupt=true to stop it. Avoid \
interactive programs.

Work step by step, check your work (for example by running the tests), and call finish \
when the task is done."""

_LOST_HEADER = "[lost: this action may or may not have run and its result cannot be known; it was not run again]"  # noqa: E501
_STATUS_HEADERS = {
    "error": "[error]",
    "interrupted": "[interrupted]",
    "rejected": "[rejected]",
    "lost": _LOST_HEADER,
}


def load_workspace_instructions(workspace: Path, max_chars: int = 20_000) -> str | None:
    """The text of ``AGENTS.md`` at the workspace root, or ``None`` if there is none.

    Text past ``max_chars`` is cut with a note saying so. A file that exists but cannot
    be read (not a regular file, no permission) gives ``None`` and a logged warning.
    """
    path = Path(workspace) / INSTRUCTIONS_FILE
    try:
        if not path.exists():
            return None
        if not path.is_file():
            raise IsADirectoryError(f"{path} is not a regular file")
        with path.open(encoding="utf-8", errors="replace") as f:
            text = f.read(max_chars + 1)
    except OSError as e:
        logger.warning("cannot read workspace instructions %s: %s", path, e)
        return None
    if len(text) > max_chars:
        note = f"[{INSTRUCTIONS_FILE} is longer than {max_chars} characters; the rest was cut]"
        text = f"{text[:max_chars]}\n\n{note}"
    return text.strip() or None


def system_message(
    system_prompt: str | None = None, workspace_instructions: str | None = None
) -> dict[str, Any]:
    """The system message: the prompt, then the workspace's instructions under a heading."""
    content = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
    if workspace_instructions:
        heading = f"## Instructions for this workspace (from {INSTRUCTIONS_FILE})"
        content = f"{content}\n\n{heading}\n\n{workspace_instructions}"
    return {"role": "system", "content": content}


def render_outcome(outcome: Outcome) -> str:
    """An outcome as the model reads it: a status line where it is not ``ok``, then the content.

    The content is already complete for the model: the sandbox writes exit codes,
    timeouts and truncation notes into it where they happen, so they are not repeated.

    >>> render_outcome(Outcome(status="lost", content="unknown"))
    '[lost]\\nunknown'
    """
    header = " ".join(_header_parts(outcome))
    if not header:
        return outcome.content or "[no output]"
    return f"{header}\n{outcome.content}" if outcome.content else header


def _header_parts(outcome: Outcome) -> list[str]:
    if outcome.status != "ok" and not (outcome.status == "error" and outcome.timed_out):
        return [_STATUS_HEADERS[outcome.status]]
    return []


@dataclass(eq=False)
class _Turn:
    """The tool calls of one model response and the outcomes known so far."""

    turn_id: str
    actions: list[ActionEvent] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.outcomes) == len(self.actions)

    def render(self) -> list[dict[str, Any]]:
        """One assistant message with the answered calls, then their tool messages."""
        answered = [a for a in self.actions if a.action_id in self.outcomes]
        thought = next((a.thought for a in self.actions if a.thought), "")
        if not answered:
            return [{"role": "assistant", "content": thought}] if thought else []
        calls = [_tool_call(a) for a in answered]
        assistant = {"role": "assistant", "content": thought or None, "tool_calls": calls}
        return [assistant, *(self._tool_message(a) for a in answered)]

    def _tool_message(self, action: ActionEvent) -> dict[str, Any]:
        content = render_outcome(self.outcomes[action.action_id])
        return {"role": "tool", "tool_call_id": action.tool_call_id, "content": content}


def _tool_call(action: ActionEvent) -> dict[str, Any]:
    function = {"name": action.tool, "arguments": action.arguments}
    return {"id": action.tool_call_id, "type": "function", "function": function}


_Item = _Turn | dict[str, Any]


class PromptBuilder:
    """Builds a session's ``messages`` incrementally: ``add`` each event as it is logged.

    Messages before the first unfinished turn are rendered once and kept; only the tail
    (normally the latest turn) is rendered again, so a step's cost does not grow with the
    session's length. ``messages()`` returns the builder's own list, updated in place by
    later calls: callers must not mutate it (nor its dicts), and must copy it to keep a
    snapshot.

        >>> builder = PromptBuilder()
        >>> builder.add(MessageEvent(source="user", text="fix the test"))
        >>> [m["role"] for m in builder.messages()]
        ['system', 'user']
    """

    def __init__(
        self, *, system_prompt: str | None = None, workspace_instructions: str | None = None
    ) -> None:
        self._messages: list[dict[str, Any]] = [
            system_message(system_prompt, workspace_instructions)
        ]
        self._n_final = 1
        """``_messages[:_n_final]`` never changes again; the rest renders ``_tail``."""
        self._tail: deque[_Item] = deque()
        self._open_turns: dict[str, _Turn] = {}
        self._waiting: dict[str, _Turn] = {}
        """Action id -> its turn, for actions whose outcome is not in yet."""
        self._setup: dict[str, ActionEvent] = {}
        """Setup steps trouper runs (source ``environment``) whose outcome is not in yet:
        the model never called them, so they reach it as a note, not as tool calls."""
        self._system_prompt = system_prompt
        self._dirty = False

    def set_workspace_instructions(self, text: str | None) -> None:
        """The workspace's instructions changed (a clone brought an AGENTS.md)."""
        self._messages[0] = system_message(self._system_prompt, text)

    def add(self, event: Event) -> None:
        """Take the next event of the log (status events are ignored)."""
        if event.is_status:
            return
        # Dispatch on the tag, not the class: it holds for any copy of the event models.
        if event.kind == "message":
            self._add_message(event)
        elif event.kind == "action":
            self._add_action(event)
        elif event.kind == "observation":
            self._add_observation(event)
        self._settle()

    def extend(self, events: Iterable[Event]) -> None:
        """``add`` each event in order."""
        for event in events:
            self.add(event)

    def messages(self) -> list[dict[str, Any]]:
        """The litellm ``messages`` for the log so far (shared: do not mutate)."""
        if self._dirty:
            del self._messages[self._n_final :]
            for item in self._tail:
                self._messages.extend(_render(item))
            self._dirty = False
        return self._messages

    def _add_message(self, event: MessageEvent) -> None:
        if not event.text:
            return
        role = "assistant" if event.source == "agent" else "user"
        self._tail.append({"role": role, "content": event.text})
        self._dirty = True

    def _add_action(self, event: ActionEvent) -> None:
        if event.source == "environment":
            self._setup[event.action_id] = event
            return
        if event.action_id in self._waiting:
            logger.warning("action %s added twice to the prompt; ignored", event.action_id)
            return
        turn = self._open_turns.get(event.turn_id)
        if turn is None:
            turn = self._open_turns[event.turn_id] = _Turn(event.turn_id)
            self._tail.append(turn)
        turn.actions.append(event)
        self._waiting[event.action_id] = turn
        self._dirty = True

    def _add_observation(self, event: ObservationEvent) -> None:
        setup = self._setup.pop(event.action_id, None)
        if setup is not None:
            what = ("it started the MCP servers" if setup.tool == "mcp_tools"
                    else f"{setup.tool} {setup.arguments}")
            self._tail.append({"role": "user", "content": (
                f"[trouper ran a setup step before you started: {what}]\n"
                f"{render_outcome(event.outcome)}")})
            self._dirty = True
            return
        turn = self._waiting.pop(event.action_id, None)
        if turn is None:
            logger.warning("outcome for unknown or answered action %s; ignored", event.action_id)
            return
        turn.outcomes[event.action_id] = event.outcome
        self._dirty = True

    def _settle(self) -> None:
        """Render for good the items at the head of the tail that can no longer change.

        A message can always settle; a turn settles once all its outcomes are in and
        something came after it (until then another call of the turn may still arrive).
        """
        while self._tail and _settled(self._tail[0], followed=len(self._tail) > 1):
            item = self._tail.popleft()
            if isinstance(item, _Turn):
                del self._open_turns[item.turn_id]
            del self._messages[self._n_final :]
            self._messages.extend(_render(item))
            self._n_final = len(self._messages)
            self._dirty = True


def _settled(item: _Item, *, followed: bool) -> bool:
    return not isinstance(item, _Turn) or (item.complete and followed)


def _render(item: _Item) -> list[dict[str, Any]]:
    return item.render() if isinstance(item, _Turn) else [item]


def build_messages(
    events: Sequence[Event],
    *,
    system_prompt: str | None = None,
    workspace_instructions: str | None = None,
) -> list[dict[str, Any]]:
    """The litellm ``messages`` for a whole log at once (see ``PromptBuilder``)."""
    builder = PromptBuilder(
        system_prompt=system_prompt, workspace_instructions=workspace_instructions
    )
    builder.extend(events)
    return builder.messages()
