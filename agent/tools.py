"""The default agent's tools as OpenAI function specs, derived from the action models.

Each tool is one model in ``trouper.messages.actions``; its ``kind`` is the tool's name.
The JSON schema comes from ``model_json_schema()`` (minus ``kind``), so the specs the
model sees and the validation ``agent.parse`` applies can never drift apart. The
descriptions are written for the model.

    >>> [spec["function"]["name"] for spec in tool_specs()]
    ['run', 'read_file', 'write_file', 'edit_file', 'think', 'finish']
"""

from __future__ import annotations

from functools import cache
from typing import Any

from ..messages.actions import EditFile, Finish, ReadFile, RunCommand, Think, WriteFile
from ..messages.base import Frozen

TOOL_MODELS: dict[str, type[Frozen]] = {
    "run": RunCommand,
    "read_file": ReadFile,
    "write_file": WriteFile,
    "edit_file": EditFile,
    "think": Think,
    "finish": Finish,
}
"""Tool name -> the action model its arguments validate into."""

_TOOL_DESCRIPTIONS: dict[str, str] = {
    "run": (
        "Run a command in a persistent bash shell whose working directory starts at the "
        "workspace folder. The current directory, exported variables and background jobs "
        "persist between calls. You get the combined stdout and stderr and the exit code. "
        "Long output keeps its head and tail; the note says how much was cut and which file "
        "holds the full text (read it with read_file). Two timeouts apply. Soft: if the "
        "command prints nothing new for a while, you get control back with the output so far "
        "while the command keeps running; call run with an empty command to wait for more "
        "of its output, or with interrupt=true to stop it with Ctrl-C. Hard: a command still "
        "running after timeout_s (or the session's default) is killed with its process "
        "group. Do not start interactive programs (editors, pagers, prompts); use "
        "non-interactive flags instead."
    ),
    "read_file": (
        "Read a text file inside the workspace, whole or a range of lines. Long content is "
        "truncated to its head and tail; ask for a line range to see the rest."
    ),
    "write_file": (
        "Create a file, or overwrite it entirely, with the given content. Missing parent "
        "folders are created. To change part of an existing file prefer edit_file."
    ),
    "edit_file": (
        "Replace one piece of text in an existing file. `old` is matched exactly (whitespace "
        "and indentation included) and must occur exactly once in the file: include enough "
        "surrounding lines to make it unique. The edit is refused if `old` is missing or "
        "occurs more than once."
    ),
    "think": (
        "Write down your reasoning or plan. Nothing runs and nothing changes; use it to "
        "think through a hard step before acting."
    ),
    "finish": (
        "End the task: call it once the work is done (or cannot be done), with a short "
        "message telling the user what you did and anything they should know."
    ),
}

_PARAM_DESCRIPTIONS: dict[tuple[str, str], str] = {
    ("run", "command"): (
        "The command line to run. An empty string runs nothing and waits for more output "
        "of a command that is still running."
    ),
    ("run", "timeout_s"): (
        "Hard limit in seconds for this command; it is killed after it. Omit to use the "
        "session's default."
    ),
    ("run", "interrupt"): (
        "true sends Ctrl-C to the command still running instead of running `command`."
    ),
    ("read_file", "path"): "Path relative to the workspace folder (or absolute inside it).",
    ("read_file", "start_line"): "First line to return, counting from 1. Omit to start at 1.",
    ("read_file", "end_line"): "Last line to return (inclusive). Omit to read to the end.",
    ("write_file", "path"): "Path relative to the workspace folder (or absolute inside it).",
    ("write_file", "content"): "The complete new content of the file.",
    ("edit_file", "path"): "Path relative to the workspace folder (or absolute inside it).",
    ("edit_file", "old"): "The exact text to replace; it must occur exactly once in the file.",
    ("edit_file", "new"): "The text to put in its place (empty to delete `old`).",
    ("think", "thought"): "Your reasoning, plan or notes.",
    ("finish", "message"): "The final message to the user.",
}


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
            "description": _TOOL_DESCRIPTIONS[tool],
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
    cleaned["description"] = _PARAM_DESCRIPTIONS[(tool, name)]
    if prop.get("default") is not None:
        cleaned["default"] = prop["default"]
    return cleaned
