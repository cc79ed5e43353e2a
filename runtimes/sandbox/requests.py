"""What an ``/execute`` request must hold: the action kinds the sandbox performs, the
fields of each (restating trouper's ``messages/actions.py``: this package runs without
trouper's models) and their JSON types."""

from __future__ import annotations

from typing import Any

FIELDS: dict[str, dict[str, tuple]] = {
    "run": {"command": (str,), "timeout_s": (int, float, type(None)), "interrupt": (bool,)},
    "read_file": {"path": (str,), "start_line": (int, type(None)), "end_line": (int, type(None))},
    "write_file": {"path": (str,), "content": (str,)},
    "edit_file": {"path": (str,), "old": (str,), "new": (str,)},
    "clone": {"url": (str,), "branch": (str, type(None))},
    "mcp": {"server": (str,), "tool": (str,), "arguments": (dict,), "spec": (dict, type(None))},
    "mcp_tools": {"servers": (list,)},
}
"""The fields of each action kind and the Python types their JSON values arrive as."""
REQUIRED = {
    "run": ("command",),
    "read_file": ("path",),
    "write_file": ("path", "content"),
    "edit_file": ("path", "old", "new"),
    "clone": ("url",),
    "mcp": ("server", "tool"),
    "mcp_tools": ("servers",),
}


class BadRequest(Exception):
    """The request is malformed; nothing was journaled or run."""


def parse_execute(request: dict[str, Any]) -> tuple[str, dict[str, Any], float, float]:
    action_id = request.get("action_id")
    if not isinstance(action_id, str) or not action_id or len(action_id) > 200:
        raise BadRequest("action_id must be a non-empty string of at most 200 characters")
    action = request.get("action")
    if not isinstance(action, dict) or action.get("kind") not in FIELDS:
        raise BadRequest(f"action must be an object whose kind is one of {sorted(FIELDS)}")
    _check_fields(action)
    timeout_s = _number(request.get("timeout_s"), "timeout_s")
    soft_s = _number(request.get("no_output_timeout_s", 0), "no_output_timeout_s")
    if timeout_s <= 0 or soft_s < 0:
        raise BadRequest("timeout_s must be > 0 and no_output_timeout_s >= 0")
    return action_id, action, timeout_s, soft_s


def _check_fields(action: dict[str, Any]) -> None:
    kind = action["kind"]
    for name in REQUIRED[kind]:
        if name not in action:
            raise BadRequest(f"a {kind} action needs {name!r}")
    for name, types in FIELDS[kind].items():
        value = action.get(name)
        wrong = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if name in action and wrong:
            raise BadRequest(f"{kind}.{name} has the wrong type: {type(value).__name__}")


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{name} must be a number")
    return float(value)


def as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer")
    return value


def checkpoint_limits(value: Any) -> dict[str, Any] | None:
    """An ``/execute`` request's ``checkpoint``: None (no snapshot), ``true`` (the
    defaults: ``{}``) or ``{max_file_bytes, max_files, ignore}``."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if not isinstance(value, dict):
        raise BadRequest("checkpoint must be true or an object of limits")
    limits: dict[str, Any] = {}
    for name in ("max_file_bytes", "max_files"):
        if name in value:
            number = value[name]
            if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
                raise BadRequest(f"checkpoint.{name} must be a positive integer")
            limits[name] = number
    if "ignore" in value:
        names = value["ignore"]
        if not isinstance(names, list) or len(names) > 1000 or not all(
                isinstance(n, str) and n and "/" not in n for n in names):
            raise BadRequest("checkpoint.ignore must be a list of file or folder names")
        limits["ignored"] = tuple(names)
    return limits
