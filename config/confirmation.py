"""Confirmation mode: the policy a session is given, and which of the agent's actions it
makes wait for the user's approval.

Pure: a policy and an action in, the reason it must wait (or None) out. The ``risky``
rules catch what a user would want to see before it runs: deleting recursively, running
as root, piping a download into a shell, rewriting git history or pushing, writing to
the repository's own metadata. They are a net for mistakes, not a sandbox: an agent that
wants to hide a command can (the Docker runtime is the boundary, docs/security.md).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import field_validator, model_validator

from ..messages.base import Frozen


class ConfirmationPolicy(Frozen):
    """Which of the agent's actions wait in AWAITING_USER_CONFIRMATION for the user to
    approve or reject them. Given as ``"never"``, ``"always"``, ``"risky"``, a list of tool
    names, or this model."""

    mode: Literal["never", "always", "tools", "risky"] = "never"
    """``never``; ``always`` (every sandbox action); ``tools`` (the ``tools`` named);
    ``risky`` (commands that match a risk rule: ``RISKY_COMMANDS`` below lists them)."""
    tools: tuple[Literal["run", "read_file", "write_file", "edit_file", "mcp"], ...] = ()
    """For ``tools``: the tools whose every call waits (``mcp``: every MCP server's tool)."""
    patterns: tuple[str, ...] = ()
    """For ``risky``: regular expressions over a ``run`` command, besides the built-in rules."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"mode": value}
        if isinstance(value, (list, tuple)):
            return {"mode": "tools", "tools": tuple(value)}
        return value

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _tools_for_tools(self) -> ConfirmationPolicy:
        if self.mode == "tools" and not self.tools:
            raise ValueError("mode 'tools' needs the tools whose calls wait")
        return self


RISKY_COMMANDS: tuple[tuple[str, str], ...] = (
    (r"\brm\s+(-[^\s]*[rRf][^\s]*\s+)+", "deletes recursively or by force"),
    (r"\bsudo\b|\bsu\s+-|\bdoas\b", "runs as another user"),
    (r"\b(curl|wget)\b[^|;&]*\|\s*(sudo\s+)?(ba|z|da)?sh\b", "pipes a download into a shell"),
    (r"\bgit\s+(push|reset\s+--hard|clean\s+-[^\s]*f|rebase|filter-branch)\b",
     "rewrites or publishes git history"),
    (r"\b(mkfs|fdisk|parted)\b|\bdd\b[^;&|]*\bof=", "writes a disk"),
    (r"\bchmod\s+(-R\s+)?[0-7]*777\b|\bchown\s+-R\b", "opens up permissions"),
    (r"\b(shutdown|reboot|poweroff|halt)\b|\bkill\s+-9\s+-1\b", "stops the machine"),
    (r">\s*/dev/(sd|nvme|hd)", "writes a disk"),
)
"""``(regular expression over a command, why it waits)``: the built-in risk rules."""
_RISKY = tuple((re.compile(pattern), why) for pattern, why in RISKY_COMMANDS)


def needs_confirmation(policy: ConfirmationPolicy, action: Any) -> str | None:
    """Why ``action`` must wait for the user's approval, or None if it may run."""
    kind = getattr(action, "kind", "")
    if policy.mode == "never" or kind not in ("run", "read_file", "write_file", "edit_file",
                                              "mcp"):
        return None
    if policy.mode == "always":
        return "every action waits for approval"
    if policy.mode == "tools":
        return f"every {kind} waits for approval" if kind in policy.tools else None
    if kind == "run" and not action.interrupt and action.command.strip():
        for pattern, why in _RISKY:
            if pattern.search(action.command):
                return f"the command {why}"
        for extra in policy.patterns:
            if re.search(extra, action.command):
                return f"the command matches the rule {extra!r}"
    if kind in ("write_file", "edit_file") and _in_git_metadata(action.path):
        return "it changes the repository's .git folder"
    return None


def _in_git_metadata(path: str) -> bool:
    return ".git" in path.replace("\\", "/").split("/")


def summary(action: Any) -> str:
    """``run: make test`` style: what the user is asked to approve, in one line."""
    kind = getattr(action, "kind", "?")
    if kind == "run":
        command = " ".join(action.command.split())
        return f"run: {command[:200]}{'…' if len(command) > 200 else ''}"
    if kind == "mcp":
        arguments = json.dumps(action.arguments, ensure_ascii=False)
        arguments = arguments[:200] + ("…" if len(arguments) > 200 else "")
        return f"mcp: {action.server}.{action.tool} {arguments}"
    path = getattr(action, "path", None)
    return f"{kind}: {path}" if path is not None else kind
