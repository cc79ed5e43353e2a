"""MCP servers in the config files: one ``[mcp.NAME]`` table per server.

A table holds the fields of ``McpServer`` (``messages/mcp.py``) but its name, which is the
table's: ``command`` (a list, or one string split as a shell does), ``env``, ``cwd``,
``url``, ``headers``, ``timeout_s``, ``startup_timeout_s``, ``required``, ``tools``. Like
every key of the files, an entry never holds a secret: a variable or header named like
one (``GITHUB_TOKEN``, ``Authorization``) must be a ``<secret:NAME>`` placeholder, its value
given to the session at run time. A project file comes with a repository its user may
not have written, so it may name stdio servers only: they start inside the sandbox, as
the agent's own commands do, while an HTTP server is reached from outside it.

    >>> mcp_problems({"t": {"command": "sh mcp_server.sh"}}, "user")
    []
    >>> server_entries({"t": {"command": "sh mcp_server.sh"}})
    {'t': {'command': ['sh', 'mcp_server.sh'], 'name': 't'}}
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pydantic import ValidationError

from ..messages.mcp import NAME_PATTERN, McpServer, pasted_secrets

MCP_TABLE = "mcp"
TABLE_FORM = ("give each server its own table: a [mcp.NAME] line, then command = "
              "[\"PROGRAM\", \"ARG\"] (a stdio server) or url = \"https://...\" (HTTP)")


def split_command(command: Any) -> Any:
    """A command given as one string, split as a shell splits it (``"npx -y pkg"``);
    anything else as it is (the model says what is wrong with it)."""
    return shlex.split(command) if isinstance(command, str) else command


def literal_secrets(entry: dict[str, Any]) -> list[str]:
    """``messages.mcp.pasted_secrets``: named here for the files' and flags' messages."""
    return pasted_secrets(entry)


def mcp_problems(table: Any, kind: str) -> list[tuple[str, str]]:
    """``(key, why)`` for each problem of a file's ``mcp`` table (``kind``: ``user`` or
    ``project``); keys read ``mcp.NAME.FIELD``, as the file's line numbers are kept."""
    if not isinstance(table, dict):
        return [(MCP_TABLE, TABLE_FORM + " (not [[mcp]])")]
    problems: list[tuple[str, str]] = []
    for name, entry in table.items():
        key = f"{MCP_TABLE}.{name}"
        if not re.match(NAME_PATTERN, name):
            problems.append((key, "a server's name is 1 to 32 letters, digits, _ or -"))
            continue
        if not isinstance(entry, dict):
            problems.append((key, TABLE_FORM))
            continue
        if "name" in entry:
            problems.append((f"{key}.name", f"the table's name is the server's: [mcp.{name}]"))
            continue
        problems += [(f"{key}.{field}", "trouper never reads a secret from a file: write "
                      "<secret:NAME> and give NAME at run time (trouper run --secret NAME)")
                     for field in literal_secrets(entry)]
        if kind == "project" and "url" in entry:
            problems.append((f"{key}.url", "a project file may not choose an HTTP MCP "
                             "server (trouper reaches it from outside the sandbox, with "
                             "the headers you give it); set it in your own file or give "
                             "--mcp"))
        try:
            McpServer.model_validate({**entry, "command": split_command(entry.get("command")),
                                      "name": name} if "command" in entry
                                     else {**entry, "name": name})
        except ValidationError as e:
            for item in e.errors():
                where = ".".join(str(part) for part in item["loc"])
                reason = item["msg"].removeprefix("Value error, ").replace(
                    "Input should be", "must be").replace("Extra inputs are not permitted",
                                                          "unknown field")
                problems.append((f"{key}.{where}" if where else key, reason))
    return problems


def server_entries(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A checked ``mcp`` table as the session's ``mcp`` entries, by name."""
    out = {}
    for name, entry in table.items():
        server = dict(entry)
        if "command" in server:
            server["command"] = split_command(server["command"])
        out[name] = {**server, "name": name}
    return out
