"""What the agent asks for: one model per tool, tagged by ``kind`` (the tool's name).

``RuntimeAction`` is the subset a sandbox executes; ``Think`` and ``Finish`` are
handled by the Controller and never reach a runtime.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import Frozen


class RunCommand(Frozen):
    """Run a shell command in the session's persistent shell."""

    kind: Literal["run"] = "run"
    command: str
    """The command line; ``""`` waits for more output of a command still running."""
    timeout_s: float | None = None
    """Hard limit for this command; ``None`` uses the session's ``command_timeout_s``."""
    interrupt: bool = False
    """Send Ctrl-C to a command still running instead of running ``command``."""


class ReadFile(Frozen):
    """Read a text file inside the workspace."""

    kind: Literal["read_file"] = "read_file"
    path: str
    """Relative to the workspace, or absolute inside it."""
    start_line: int | None = None
    """First line to return (1-based); ``None`` means the first."""
    end_line: int | None = None
    """Last line to return (inclusive); ``None`` means the last."""


class WriteFile(Frozen):
    """Create or overwrite a file inside the workspace (parents are created)."""

    kind: Literal["write_file"] = "write_file"
    path: str
    content: str


class EditFile(Frozen):
    """Replace exactly one occurrence of ``old`` with ``new`` in a workspace file."""

    kind: Literal["edit_file"] = "edit_file"
    path: str
    old: str
    new: str


class Think(Frozen):
    """Record a thought; nothing runs."""

    kind: Literal["think"] = "think"
    thought: str


class Finish(Frozen):
    """End the task with a message to the user."""

    kind: Literal["finish"] = "finish"
    message: str


RuntimeAction = Annotated[
    RunCommand | ReadFile | WriteFile | EditFile, Field(discriminator="kind")
]
Action = Annotated[
    RunCommand | ReadFile | WriteFile | EditFile | Think | Finish, Field(discriminator="kind")
]
RUNTIME_KINDS: frozenset[str] = frozenset({"run", "read_file", "write_file", "edit_file"})
