"""The default agent's tools as OpenAI function specs, derived from the action models.

Each tool is one model in ``trouper.messages.actions`` (its ``kind`` is the tool's name,
its ``description`` and its fields' descriptions are written for the model). The JSON
schema comes from ``model_json_schema()`` (minus ``kind``), so the specs the model sees
and the validation ``agent.parse`` applies can never drift apart.

    >>> [spec["function"]["name"] for spec in tool_specs()]
    ['run', 'read_file', 'write_file', 'edit_file', 'think', 'finish']
"""

from __future__ import annotations

from functools import cache
from typing import Any

from ..messages.actions import ACTIONS, kind_of
from ..messages.base import Frozen

TOOL_MODELS: dict[str, type[Frozen]] = {kind_of(model): model for model in ACTIONS}
"""Tool name -> the action model its arguments validate into."""


@cache
def tool_specs() -> list[dict[str, Any]]:
    """The OpenAI function specs of every tool, for litellm's ``tools=`` argument.

    The list is built once and shared: callers must not mutate it.
    """
    return [_spec(name) for name in TOOL_MODELS]


@cache
def argument_summary(tool: str) -> str:
    """``"path (string), old (string), new (string)"``: what ``tool`` expects, for errors."""
    schema = _parameters(tool)
    required = set(schema["required"])
    parts = []
    for name, prop in schema["properties"].items():
        optional = "" if name in required else ", optional"
        parts.append(f"{name} ({prop['type']}{optional})")
    return ", ".join(parts)


def parameter_types(tool: str) -> dict[str, str]:
    """JSON type of each argument of ``tool`` (``{"command": "string", ...}``)."""
    return {name: prop["type"] for name, prop in _parameters(tool)["properties"].items()}


def _spec(tool: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool,
            "description": TOOL_MODELS[tool].description,  # type: ignore[attr-defined]
            "parameters": _parameters(tool),
        },
    }


@cache
def _parameters(tool: str) -> dict[str, Any]:
    """The model's JSON schema without ``kind``, titles or null branches, described."""
    schema = TOOL_MODELS[tool].model_json_schema()
    properties = {
        name: _clean_property(tool, name, prop)
        for name, prop in schema["properties"].items()
        if name != "kind"
    }
    return {
        "type": "object",
        "properties": properties,
        "required": [name for name in schema.get("required", []) if name != "kind"],
        "additionalProperties": False,
    }


def _clean_property(tool: str, name: str, prop: dict[str, Any]) -> dict[str, Any]:
    """``anyOf [X, null]`` -> ``X`` (omitting the argument is how to say "none")."""
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    if len(branches) != 1:
        raise TypeError(f"{tool}.{name}: cannot express {prop!r} as one JSON type")
    cleaned: dict[str, Any] = {"type": branches[0]["type"]}
    if "description" not in prop:
        raise TypeError(f"{tool}.{name} has no Field(description=...) for the model to read")
    cleaned["description"] = prop["description"]
    if prop.get("default") is not None:
        cleaned["default"] = prop["default"]
    return cleaned
