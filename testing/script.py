"""The script a ``FakeLLMServer`` plays: one step per model call, in order.

A script is a JSON list of steps (or ``{"steps": [...]}``). Step ``k`` answers a
conversation that already holds ``k`` assistant messages. Each step is one of:

```json
{"tool": "run", "args": {"command": "echo one"}}
{"tool": "run", "raw_args": "{not json"}
{"tools": [{"tool": "run", "args": {"command": "true"}}, {"tool": "think", "args": {}}]}
{"say": "a text reply, which ends the agent's turn"}
```

``Script.from_session(events)`` builds the script a recorded session's model played
(``testing/replay.py`` reruns it against today's code and tools).

Any step may also carry ``say`` beside its tools (the assistant's content next to the
tool calls), ``fail`` (errors served in order before the step succeeds) and
``delay_s`` (how long the step's answer is held back). Tool names are not checked:
rejecting an unknown tool is the agent's job.

Example:
    >>> script = load_script([{"say": "hello"}])
    >>> script.steps[0].say
    'hello'
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..exceptions import TrouperError


class ScriptError(TrouperError, ValueError):
    """A script that cannot be loaded; the message names the step and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCallSpec(_Model):
    """One tool call the fake model makes."""

    tool: str = Field(min_length=1)
    """The tool's name, sent as is (unknown names are allowed on purpose)."""
    args: dict[str, Any] | None = None
    """The arguments, sent as a JSON string; ``None`` (and no ``raw_args``) sends ``{}``."""
    raw_args: str | None = None
    """The arguments string sent verbatim, e.g. malformed JSON; excludes ``args``."""

    @model_validator(mode="after")
    def _one_kind_of_args(self) -> ToolCallSpec:
        if self.args is not None and self.raw_args is not None:
            raise ValueError("give either 'args' or 'raw_args', not both")
        return self

    @property
    def arguments(self) -> str:
        """The arguments string as served."""
        if self.raw_args is not None:
            return self.raw_args
        return json.dumps(self.args or {})


class Failure(_Model):
    """One error response served before a step succeeds."""

    status: int = Field(ge=400, le=599)
    """The HTTP status code, e.g. 429, 500, 503."""
    retry_after: float | None = Field(default=None, ge=0)
    """Seconds sent in a ``Retry-After`` header; ``None`` sends none."""
    retry_after_ms: int | None = Field(default=None, ge=0)
    """Milliseconds sent in a ``retry-after-ms`` header; ``None`` sends none."""
    message: str | None = None
    """The error body's message; ``None`` uses a default naming the status and step."""
    headers: dict[str, str] = Field(default_factory=dict)
    """More response headers to send."""


class Step(_Model):
    """What the fake model answers to one call: tool calls, text, or both."""

    tool: str | None = Field(default=None, min_length=1)
    """A single tool call's name (with ``args`` or ``raw_args``); excludes ``tools``."""
    args: dict[str, Any] | None = None
    raw_args: str | None = None
    tools: tuple[ToolCallSpec, ...] | None = None
    """Several tool calls in one response; excludes ``tool``."""
    say: str | None = None
    """The assistant's text; alone it ends the agent's turn (``finish_reason`` "stop")."""
    fail: tuple[Failure, ...] = ()
    """Errors served in order, one per attempt, before the step succeeds."""
    delay_s: float = Field(default=0.0, ge=0)
    """Extra time before this step's successful answer is sent."""

    @model_validator(mode="after")
    def _check_shape(self) -> Step:
        if self.tool is not None and self.tools is not None:
            raise ValueError("give either 'tool' or 'tools', not both")
        if self.tool is None and (self.args is not None or self.raw_args is not None):
            raise ValueError("'args' and 'raw_args' need 'tool'")
        if self.args is not None and self.raw_args is not None:
            raise ValueError("give either 'args' or 'raw_args', not both")
        if self.tools is not None and not self.tools:
            raise ValueError("'tools' must hold at least one tool call")
        if self.tool is None and self.tools is None and self.say is None:
            raise ValueError("a step needs 'tool', 'tools' or 'say'")
        return self

    @property
    def calls(self) -> tuple[ToolCallSpec, ...]:
        """The tool calls of this step, whichever form it was written in."""
        if self.tools is not None:
            return self.tools
        if self.tool is not None:
            return (ToolCallSpec(tool=self.tool, args=self.args, raw_args=self.raw_args),)
        return ()


class Script(_Model):
    """The steps a fake model plays, one per model call."""

    steps: tuple[Step, ...]

    @classmethod
    def from_session(cls, events: Iterable[Any]) -> Script:
        """The script that answers as a recorded session's model did: one step per model
        call its log holds (``LLMCompleted``), in order, so step ``k`` is again the answer
        to the session's ``k``-th call (the turn the broker names in ``X-Trouper-Turn``).

        The reply is what ``core/loop.py`` recorded in the same append as the call:
        the agent's ``ActionEvent``s of one turn (their tool names and raw arguments, in
        order, the turn's ``thought`` as ``say``), an agent ``MessageEvent`` (``say``), or
        a summary of the summarizing condenser (``PromptCondensed``: its text as ``say``).
        Setup actions and user messages are no model's reply and are left out.

        Raises:
            ScriptError: a recorded model call with no reply after it (a log cut short).
        """
        from ..messages.events import LLMCompleted

        log = list(events)
        steps = [_reply_after(log, i) for i, event in enumerate(log)
                 if isinstance(event, LLMCompleted)]
        return cls(steps=tuple(steps))


ScriptSource = str | Path | Script | Sequence[Step | dict[str, Any]] | dict[str, Any]


def _reply_after(log: list[Any], at: int) -> Step:
    """The reply recorded right after the model call at ``log[at]`` (one append holds both)."""
    reply = log[at + 1] if at + 1 < len(log) else None
    seq = getattr(log[at], "seq", "?")
    try:
        step = _step_of(log, at, reply)
    except ValidationError as e:  # e.g. a recorded call with an empty tool name
        raise ScriptError(f"the reply recorded after seq {seq} cannot be played: {e}") from e
    if step is None:
        raise ScriptError(f"the model call recorded at seq {seq} has no reply after it")
    return step


def _step_of(log: list[Any], at: int, reply: Any) -> Step | None:
    from ..messages.events import ActionEvent, MessageEvent, PromptCondensed

    if isinstance(reply, PromptCondensed) and reply.summary:
        return Step(say=reply.summary)
    if isinstance(reply, MessageEvent) and reply.source == "agent":
        return Step(say=reply.text)
    if isinstance(reply, ActionEvent) and reply.source == "agent":
        turn = []
        for event in log[at + 1:]:
            if not (isinstance(event, ActionEvent) and event.source == "agent"
                    and event.turn_id == reply.turn_id):
                break
            turn.append(_call_of(event.tool, event.arguments))
        say = reply.thought or None
        if len(turn) == 1:
            return Step(tool=turn[0].tool, args=turn[0].args, raw_args=turn[0].raw_args,
                        say=say)
        return Step(tools=tuple(turn), say=say)
    return None


def _call_of(tool: str, arguments: str) -> ToolCallSpec:
    """A recorded call as the script's step: ``args`` when serving them gives back the
    very same string (a readable script), else the string verbatim (``raw_args``)."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and json.dumps(parsed) == arguments:
        return ToolCallSpec(tool=tool, args=parsed)
    return ToolCallSpec(tool=tool, raw_args=arguments)


def load_script(source: ScriptSource) -> Script:
    """Build a ``Script`` from a JSON file's path, a list of steps, or a ``Script``.

    Raises:
        ScriptError: the file cannot be read or parsed, or a step is invalid; the
            message names the step (0-based, as in "step k answers k assistant
            messages") and the field.
    """
    if isinstance(source, Script):
        return source
    data = _read_file(Path(source)) if isinstance(source, str | Path) else source
    where = f" in {source}" if isinstance(source, str | Path) else ""
    if isinstance(data, dict) and set(data) == {"steps"}:
        data = data["steps"]
    if not isinstance(data, list | tuple):
        msg = f"a script must be a JSON list of steps{where}, got {type(data).__name__}"
        raise ScriptError(msg)
    try:
        return Script(steps=tuple(data))
    except ValidationError as e:
        raise ScriptError(_describe(e, where)) from e


def _read_file(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ScriptError(f"cannot read script {path}: {e}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        msg = f"script {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        raise ScriptError(msg) from e


def _describe(error: ValidationError, where: str) -> str:
    """One line per problem: ``step 3, field 'fail[0].status': <reason>``."""
    lines = [f"invalid script{where}:"]
    for item in error.errors():
        lines.append(f"  {_place(item['loc'])}: {item['msg']}")
    return "\n".join(lines)


def _place(loc: tuple[int | str, ...]) -> str:
    rest = list(loc[1:]) if loc[:1] == ("steps",) else list(loc)
    if not rest or not isinstance(rest[0], int):
        return "script"
    step, parts = rest[0], rest[1:]
    field = ""
    for part in parts:
        field += f"[{part}]" if isinstance(part, int) else f".{part}" if field else str(part)
    return f"step {step}, field '{field}'" if field else f"step {step}"
