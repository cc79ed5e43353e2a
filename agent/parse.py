"""Turning a model response into actions, and malformed tool calls into clear rejections.

Nothing here raises on model input (I6 in docs/promises.md): a call that cannot be parsed still
becomes an ``ActionEvent`` (with ``action=None``) and a ``rejected`` outcome that tells
the model exactly what was wrong and what the tool expects.

    >>> from trouper.messages.protocol import ToolCall
    >>> ids = iter(["a1"])
    >>> [parsed] = parse_response("t1", "", [ToolCall(id="c1", name="edit_file",
    ...     arguments='{"path": "x.py", "new": "y"}')], lambda: next(ids))
    >>> print(parsed.rejection.content)  # doctest: +NORMALIZE_WHITESPACE
    edit_file: missing required argument 'old'. Expected arguments: path (string),
    old (string), new (string).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..messages.actions import McpCall, RunCommand
from ..messages.base import Frozen
from ..messages.events import ActionEvent
from ..messages.mcp import McpTool
from ..messages.outcomes import Outcome
from ..messages.protocol import ToolCall
from .tools import TOOL_MODELS, argument_summary, parameter_types

logger = logging.getLogger(__name__)

_MAX_SHOWN_CHARS = 60
"""How much of a wrong value an error message quotes."""


@dataclass(frozen=True)
class ParsedCall:
    """One tool call of a response: its event, and why it was refused if it was."""

    event: ActionEvent
    """Always set; ``event.action`` is ``None`` exactly when ``rejection`` is set."""
    rejection: Outcome | None = None
    """A ``rejected`` outcome for a malformed call; ``None`` when the action is valid."""


class _Malformed(Exception):
    """A tool call the model got wrong; the message is what the model will read."""


def parse_response(
    turn_id: str,
    content: str,
    tool_calls: Sequence[ToolCall],
    new_action_id: Callable[[], str],
    mcp_tools: Mapping[str, McpTool] | None = None,
) -> list[ParsedCall]:
    """Turn one model response into one ``ParsedCall`` per tool call, in order.

    ``content`` becomes the ``thought`` of the first call. A call without an id (or with
    an id already used in this response) gets ``call_<action_id>``, so every tool result
    can answer exactly one call. No tool calls gives an empty list. ``mcp_tools`` are the
    MCP servers' tools the model was offered, by offered name (a call of one is a
    ``McpCall``).
    """
    parsed: list[ParsedCall] = []
    seen_ids: set[str] = set()
    for index, call in enumerate(tool_calls):
        action_id = new_action_id()
        tool_call_id = call.id if call.id and call.id not in seen_ids else f"call_{action_id}"
        seen_ids.add(tool_call_id)
        thought = content if index == 0 else ""
        parsed.append(_parse_call(turn_id, action_id, tool_call_id, call, thought,
                                  mcp_tools or {}))
    return parsed


def _parse_call(
    turn_id: str, action_id: str, tool_call_id: str, call: ToolCall, thought: str,
    mcp_tools: Mapping[str, McpTool],
) -> ParsedCall:
    try:
        action, rejection = _validate(call.name, call.arguments, mcp_tools), None
    except _Malformed as e:
        logger.info("rejected tool call %s (%s): %s", tool_call_id, call.name, e)
        action, rejection = None, Outcome(status="rejected", content=str(e))
    event = ActionEvent(
        action_id=action_id,
        turn_id=turn_id,
        tool_call_id=tool_call_id,
        tool=call.name,
        arguments=call.arguments,
        action=action,
        thought=thought,
    )
    return ParsedCall(event=event, rejection=rejection)


def _validate(tool: str, arguments: str, mcp_tools: Mapping[str, McpTool]) -> Frozen:
    """Validate one call's raw JSON arguments into the tool's action model.

    Raises:
        _Malformed: with the message for the model (never anything else).
    """
    if tool in mcp_tools:
        return _mcp_call(mcp_tools[tool], arguments)
    model = TOOL_MODELS.get(tool)
    if model is None:
        raise _Malformed(_unknown_tool(tool, mcp_tools))
    data = _load_object(tool, arguments)
    problems = _extra_arguments(tool, data)
    try:
        action = model.model_validate(data)
    except ValidationError as e:
        problems += [_describe(tool, error) for error in e.errors()]
    else:
        problems += _value_problems(action)
    if problems:
        raise _Malformed(_expected(tool, "; ".join(problems)))
    return action


def _mcp_call(offered: McpTool, arguments: str) -> McpCall:
    """A call of an MCP server's tool: a JSON object holding the arguments its schema
    requires (the server checks the rest, and its refusal is the outcome)."""
    data = _load_object(offered.name, arguments)
    required = offered.parameters.get("required") or []
    missing = [name for name in required if isinstance(name, str) and name not in data]
    if missing:
        names = ", ".join(_quote(name) for name in missing)
        expected = ", ".join(offered.parameters.get("properties") or {}) or "none"
        raise _Malformed(f"{offered.name}: missing required argument {names}. Expected "
                         f"arguments: {expected}.")
    return McpCall(server=offered.server, tool=offered.tool, arguments=data)


def _unknown_tool(tool: str, mcp_tools: Mapping[str, McpTool]) -> str:
    available = ", ".join([*TOOL_MODELS, *mcp_tools])
    if not tool:
        return f"the tool call has no tool name. Available tools: {available}."
    return f"unknown tool {_quote(tool)}. Available tools: {available}."


def _load_object(tool: str, arguments: str) -> dict[str, Any]:
    """The arguments as a dict; ``""`` counts as ``{}`` (some models send it for none)."""
    if not arguments.strip():
        return {}
    try:
        data = json.loads(arguments, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        reason = f"the arguments are not valid JSON ({e}); send one JSON object"
        raise _Malformed(_expected(tool, reason)) from None
    if not isinstance(data, dict):
        reason = f"the arguments must be a JSON object, got {_json_type(data)}"
        raise _Malformed(_expected(tool, reason))
    return data


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _extra_arguments(tool: str, data: dict[str, Any]) -> list[str]:
    """Unknown keys; ``kind`` included (the tool name already says it)."""
    known = parameter_types(tool)
    extra = [key for key in data if key not in known]
    for key in extra:
        data.pop(key)
    return [f"unexpected argument {_quote(key)}" for key in extra]


def _describe(tool: str, error: Any) -> str:
    """One pydantic error, said for the model."""
    loc = error.get("loc") or ()
    name = str(loc[0]) if loc else ""
    if error["type"] == "missing":
        return f"missing required argument {_quote(name)}"
    expected = parameter_types(tool).get(name)
    if expected is None or len(loc) != 1:
        return f"argument {_quote(name)}: {error.get('msg', 'invalid value')}"
    article = "an" if expected[0] in "aeiou" else "a"
    got = error.get("input")
    return f"argument {_quote(name)} must be {article} {expected}, got {_show(got)}"


def _value_problems(action: Frozen) -> list[str]:
    """Checks the schema cannot say: values of the right type that make no sense."""
    if isinstance(action, RunCommand) and action.timeout_s is not None:
        if not math.isfinite(action.timeout_s) or action.timeout_s <= 0:
            return [f"argument 'timeout_s' must be a positive number, got {action.timeout_s}"]
    return []


def _expected(tool: str, problem: str) -> str:
    if tool not in TOOL_MODELS:  # an MCP server's tool: its schema is the model's to read
        return f"{tool}: {problem}."
    return f"{tool}: {problem}. Expected arguments: {argument_summary(tool)}."


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _show(value: Any) -> str:
    """``a string "abc"``: the JSON type and a short quote of a wrong value."""
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > _MAX_SHOWN_CHARS:
        text = text[:_MAX_SHOWN_CHARS] + "..."
    return f"{_json_type(value)} {text}" if value is not None else "null"


def _quote(name: str) -> str:
    shown = name if len(name) <= _MAX_SHOWN_CHARS else name[:_MAX_SHOWN_CHARS] + "..."
    return f"'{shown}'"
