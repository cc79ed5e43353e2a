"""MCP servers a session's agent may call, and the tools they offer it.

A session is given servers (``SessionConfig.mcp``): a stdio server's ``command`` is started
inside the sandbox, where the agent's shell runs; a streamable HTTP server's ``url`` is
reached from where the sandbox server runs. Secrets reach a server only as placeholders,
``<secret:NAME>`` in ``env`` or ``headers``, revealed where it runs: the session stores
the placeholders, never the values.

The tools a server lists are offered to the model beside trouper's own, each named
``mcp__<server>__<tool>`` (``offered_name``), so they never clash with trouper's tools or
with each other's servers.

    >>> McpServer(command=("npx", "-y", "@modelcontextprotocol/server-memory")).label
    'server-memory'
    >>> offered_name("github", "create.issue")
    'mcp__github__create_issue'
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from .base import Frozen

NAME_PATTERN = r"^[A-Za-z0-9_-]{1,32}$"
"""What a server's name may be: it becomes part of its tools' names."""
TOOL_PREFIX = "mcp__"
MAX_TOOL_NAME = 64
"""The longest tool name providers take (OpenAI's, and Anthropic's)."""
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]")
_SECRET = re.compile(r"<secret:([A-Za-z_][A-Za-z0-9_]*)>")
_SECRET_LIKE = re.compile(r"(^|[_-])(api_?key|key|token|secret|password|auth|authorization)"
                          r"($|[_-])", re.I)
"""An ``env`` or ``headers`` name whose value is a secret."""


def pasted_secrets(entry: dict[str, Any]) -> list[str]:
    """The ``env.NAME`` and ``headers.NAME`` of a server (as given) named like a secret
    whose value holds no ``<secret:NAME>`` placeholder: a value pasted where a name
    belongs, which would be stored with the session and journaled in the sandbox."""
    found = []
    for part in ("env", "headers"):
        values = entry.get(part)
        if not isinstance(values, dict):
            continue
        found += [f"{part}.{name}" for name, value in values.items()
                  if _SECRET_LIKE.search(str(name)) and isinstance(value, str)
                  and not _SECRET.search(value)]
    return found


class McpServer(Frozen):
    """One MCP server: ``command`` (stdio, started inside the sandbox) or ``url``
    (streamable HTTP), never both."""

    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    """The server's name in its tools' names (``mcp__<name>__<tool>``); None takes it
    from the command's program or the URL's host (``label``)."""
    command: tuple[str, ...] | None = None
    """A stdio server: the program and its arguments, started inside the sandbox (the
    shell's confinement on the local runtime, the container on Docker)."""
    env: dict[str, str] = Field(default_factory=dict)
    """More environment for a stdio server, over a minimal one (PATH, HOME, LANG...);
    give a secret as ``<secret:NAME>``, one of the session's secrets."""
    cwd: str | None = None
    """A stdio server's working folder, relative to the workspace; None: the workspace."""
    url: str | None = None
    """A streamable HTTP server's endpoint (``http://`` or ``https://``)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers sent with every request (``Authorization: Bearer <secret:TOKEN>``)."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Limit for one tool call; None: the session's ``command_timeout_s``."""
    startup_timeout_s: float = Field(default=30.0, gt=0)
    """Limit for starting the server and listing its tools."""
    required: bool = True
    """A server that fails to start ends the session's setup in ERROR naming it; False
    lets the session go on without its tools (the failure is in the log all the same)."""
    tools: tuple[str, ...] | None = None
    """The tools of the server offered to the model (its own names); None: all of them."""

    @model_validator(mode="after")
    def _no_pasted_secret(self) -> McpServer:
        pasted = pasted_secrets({"env": self.env, "headers": self.headers})
        if pasted:
            raise ValueError(f"{', '.join(pasted)} looks like a secret given as it is: it "
                             "would be stored with the session; give it as <secret:NAME>, "
                             "one of the session's secrets")
        return self

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (an HTTP server)")
        if self.command is not None and (not self.command or not self.command[0].strip()):
            raise ValueError("command must name a program")
        if self.url is None and self.headers:
            raise ValueError("headers are for an HTTP server (url)")
        if self.command is None and (self.env or self.cwd is not None):
            raise ValueError("env and cwd are for a stdio server (command)")
        return self

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.lower().startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("cwd")
    @classmethod
    def _inside(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("/") or ".." in value.split("/")):
            raise ValueError("must be a folder inside the workspace, relative to it")
        return value

    @property
    def label(self) -> str:
        """The name, or one made from the program (its last word that is no option) or
        the URL's host."""
        if self.name is not None:
            return self.name
        if self.command is not None:
            words = [w for w in self.command if not w.startswith("-")] or [self.command[0]]
            base = words[-1].rstrip("/").rsplit("/", 1)[-1].rsplit("@", 1)[0]
            base = re.sub(r"\.(py|js|mjs|ts|sh)$", "", base)
        else:
            base = re.sub(r"^[a-z]+://", "", self.url or "", flags=re.I).split("/")[0]
            base = base.split(":")[0]
        return (_NOT_IN_NAME.sub("_", base).strip("_") or "mcp")[:32]

    def secret_names(self) -> set[str]:
        """The secrets its ``env`` and ``headers`` name as ``<secret:NAME>``."""
        texts = [*self.env.values(), *self.headers.values()]
        return {name for text in texts for name in _SECRET.findall(text)}


def named(servers: tuple[McpServer, ...]) -> tuple[McpServer, ...]:
    """``servers`` each with its name: a missing one from its ``label``, made unique
    (``_2``...); two servers given the same name are refused (ValueError)."""
    given = [s.name for s in servers if s.name is not None]
    if len(given) != len(set(given)):
        twice = sorted({n for n in given if given.count(n) > 1})
        raise ValueError(f"two MCP servers are named {', '.join(twice)}")
    taken, out = set(given), []
    for server in servers:
        if server.name is None:
            base = name = server.label
            n = 1
            while name in taken:
                n += 1
                name = f"{base[:29]}_{n}"
            taken.add(name)
            server = server.model_copy(update={"name": name})
        out.append(server)
    return tuple(out)


class McpTool(Frozen):
    """A tool an MCP server listed, as the model is offered it."""

    name: str
    """The name the model calls (``mcp__<server>__<tool>``, unique in the session)."""
    server: str
    tool: str
    """The server's own name for it."""
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    """Its input schema (JSON Schema of an object)."""

    def spec(self) -> dict[str, Any]:
        """The OpenAI function spec the model is offered."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description or f"{self.tool} ({self.server})",
            "parameters": self.parameters}}


def offered_name(server: str, tool: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """``mcp__<server>__<tool>``: characters providers refuse become ``_``, the name is cut
    to ``MAX_TOOL_NAME`` and made unique among ``taken`` (``_2``...)."""
    name = f"{TOOL_PREFIX}{server}__{_NOT_IN_NAME.sub('_', tool)}"[:MAX_TOOL_NAME]
    base, n = name, 1
    while name in taken:
        n += 1
        suffix = f"_{n}"
        name = base[:MAX_TOOL_NAME - len(suffix)] + suffix
    return name


def tools_of(server: McpServer, listed: list[dict[str, Any]],
             taken: set[str]) -> list[McpTool]:
    """The tools a server listed (``{"name", "description", "inputSchema"}`` each), those
    ``server.tools`` allows, named for the model; adds their names to ``taken``."""
    out = []
    for item in listed:
        tool = str(item.get("name") or "")
        if not tool or (server.tools is not None and tool not in server.tools):
            continue
        schema = item.get("inputSchema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            schema = {"type": "object", "properties": {}}
        name = offered_name(server.name or server.label, tool, taken)
        taken.add(name)
        out.append(McpTool(name=name, server=server.name or server.label, tool=tool,
                           description=str(item.get("description") or ""),
                           parameters=schema))
    return out
