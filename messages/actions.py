"""What the agent asks for: one model per tool, tagged by ``kind`` (the tool's name).

This is the one place a tool is defined. Its model says what the model may send (its
fields, with ``Field(description=...)`` for the model to read), ``description`` says what
the tool does, and ``in_sandbox`` whether a runtime executes it (``Think`` and ``Finish``
are handled by the session core and never reach one). Everything else is derived from
``ACTIONS``: the tool specs (``agent/tools.py``), the parser's validation, the set of
kinds a runtime executes. An MCP server's tools are the one exception: they are listed by
the server, and every call of one is a ``McpCall``. To add a tool: write its model here
and add it to ``ACTIONS`` and to the unions below (``tests/test_agent_parse.py`` checks
they agree); a sandbox tool is then implemented in ``runtimes/sandbox/service.py``
(``tests/test_sandbox_schema.py`` holds its restated schema equal to the model).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from .base import Frozen
from .mcp import McpServer

_PATH = "Path relative to the workspace folder (or absolute inside it)."


class RunCommand(Frozen):
    """Run a shell command in the session's persistent shell."""

    description: ClassVar[str] = (
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
        "non-interactive flags instead.")
    in_sandbox: ClassVar[bool] = True

    kind: Literal["run"] = "run"
    command: str = Field(description=(
        "The command line to run. An empty string runs nothing and waits for more output "
        "of a command that is still running."))
    """The command line; ``""`` waits for more output of a command still running."""
    timeout_s: float | None = Field(default=None, description=(
        "Hard limit in seconds for this command; it is killed after it. Omit to use the "
        "session's default."))
    """Hard limit for this command; ``None`` uses the session's ``command_timeout_s``."""
    interrupt: bool = Field(default=False, description=(
        "true sends Ctrl-C to the command still running instead of running `command`."))
    """Send Ctrl-C to a command still running instead of running ``command``."""


class ReadFile(Frozen):
    """Read a text file inside the workspace."""

    description: ClassVar[str] = (
        "Read a text file inside the workspace, whole or a range of lines. Long content is "
        "truncated to its head and tail; ask for a line range to see the rest.")
    in_sandbox: ClassVar[bool] = True

    kind: Literal["read_file"] = "read_file"
    path: str = Field(description=_PATH)
    start_line: int | None = Field(default=None, description=(
        "First line to return, counting from 1. Omit to start at 1."))
    end_line: int | None = Field(default=None, description=(
        "Last line to return (inclusive). Omit to read to the end."))


class WriteFile(Frozen):
    """Create or overwrite a file inside the workspace (parents are created)."""

    description: ClassVar[str] = (
        "Create a file, or overwrite it entirely, with the given content. Missing parent "
        "folders are created. To change part of an existing file prefer edit_file.")
    in_sandbox: ClassVar[bool] = True

    kind: Literal["write_file"] = "write_file"
    path: str = Field(description=_PATH)
    content: str = Field(description="The complete new content of the file.")


class EditFile(Frozen):
    """Replace exactly one occurrence of ``old`` with ``new`` in a workspace file."""

    description: ClassVar[str] = (
        "Replace one piece of text in an existing file. `old` is matched exactly (whitespace "
        "and indentation included) and must occur exactly once in the file: include enough "
        "surrounding lines to make it unique. The edit is refused if `old` is missing or "
        "occurs more than once.")
    in_sandbox: ClassVar[bool] = True

    kind: Literal["edit_file"] = "edit_file"
    path: str = Field(description=_PATH)
    old: str = Field(description=(
        "The exact text to replace; it must occur exactly once in the file."))
    new: str = Field(description="The text to put in its place (empty to delete `old`).")


class Think(Frozen):
    """Record a thought; nothing runs."""

    description: ClassVar[str] = (
        "Write down your reasoning or plan. Nothing runs and nothing changes; use it to "
        "think through a hard step before acting.")
    in_sandbox: ClassVar[bool] = False

    kind: Literal["think"] = "think"
    thought: str = Field(description="Your reasoning, plan or notes.")


class Finish(Frozen):
    """End the task with a message to the user."""

    description: ClassVar[str] = (
        "End the task: call it once the work is done (or cannot be done), with a short "
        "message telling the user what you did and anything they should know.")
    in_sandbox: ClassVar[bool] = False

    kind: Literal["finish"] = "finish"
    message: str = Field(description="The final message to the user.")


class CloneRepository(Frozen):
    """Clone a git repository into the (empty) workspace: a session's setup step, run where
    the workspace is. Not a tool: the model is never offered it (it is not in ``ACTIONS``)."""

    description: ClassVar[str] = "Clone a git repository into the workspace."
    in_sandbox: ClassVar[bool] = True

    kind: Literal["clone"] = "clone"
    url: str
    """A URL git understands, or a path on the machine the sandbox server runs on."""
    branch: str | None = None
    """The branch or tag to check out; ``None`` takes the repository's default."""


class McpCall(Frozen):
    """A call of a tool an MCP server offers (``messages/mcp.py``): the model calls it by
    its offered name, and the log records which server and tool it reached."""

    description: ClassVar[str] = "Call a tool of an MCP server."
    in_sandbox: ClassVar[bool] = True

    kind: Literal["mcp"] = "mcp"
    server: str
    """The server's name in the session's ``mcp``."""
    tool: str
    """The server's own name for the tool."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    spec: McpServer | None = None
    """How to reach the server: set when the call is sent to the sandbox, never stored
    with the action (the session's config holds it)."""


class ListMcpTools(Frozen):
    """Start a session's MCP servers and list their tools: its last setup step, after the
    clone and the setup script (which may install a server). Not a tool."""

    description: ClassVar[str] = "Start the MCP servers and list their tools."
    in_sandbox: ClassVar[bool] = True

    kind: Literal["mcp_tools"] = "mcp_tools"
    servers: tuple[McpServer, ...]


ACTIONS: tuple[type[Frozen], ...] = (RunCommand, ReadFile, WriteFile, EditFile, Think, Finish)
"""Every tool, in the order the model sees them (an MCP server's tools come after)."""
SETUP_ACTIONS: tuple[type[Frozen], ...] = (CloneRepository, ListMcpTools)
"""Actions trouper itself runs before the first step (never offered to the model)."""
OFFERED_ACTIONS: tuple[type[Frozen], ...] = (McpCall,)
"""Actions the model reaches through tools a session is given (an MCP server's)."""

RuntimeAction = Annotated[
    RunCommand | ReadFile | WriteFile | EditFile | CloneRepository | McpCall | ListMcpTools,
    Field(discriminator="kind"),
]
Action = Annotated[
    RunCommand | ReadFile | WriteFile | EditFile | Think | Finish | CloneRepository | McpCall
    | ListMcpTools,
    Field(discriminator="kind"),
]


def kind_of(model: type[Frozen]) -> str:
    """The tool name of an action model (its ``kind``)."""
    return str(model.model_fields["kind"].default)


RUNTIME_KINDS: frozenset[str] = frozenset(
    kind_of(model) for model in (*ACTIONS, *SETUP_ACTIONS, *OFFERED_ACTIONS)
    if getattr(model, "in_sandbox", False))
"""The kinds a runtime executes."""
