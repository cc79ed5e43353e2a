"""``trouper run``'s MCP servers (``--mcp``) and secrets (``--secret``), with the config
files' ``[mcp.NAME]`` servers (docs/cli.md, "MCP servers").

``--mcp`` reads ``NAME=COMMAND ARGS...`` (a stdio server, split as a shell splits it; words
``VAR=VALUE`` before the program are its environment), ``NAME=URL`` (a streamable HTTP
server) or a JSON object (any field of ``McpServer``). A server of the files and a flag's
of the same name: the flag's wins.

A secret's value never comes from the command line (``ps`` shows it to every user of the
machine): ``--secret NAME`` gives the session the secret NAME, its value read from this
shell's variable NAME. The ``<secret:NAME>`` placeholders of a server you wrote (a flag, your
own config file) are given the same way without ``--secret``; a project file's server gets
a secret only when you give ``--secret NAME`` yourself, since the project chose it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click
from pydantic import ValidationError

from ..config.files import ENV_NAME, ConfigFiles
from ..config.layers import FLAG, resolve_mcp
from ..config.mcp_files import literal_secrets
from ..messages.mcp import NAME_PATTERN, McpServer

SPEC_FORM = ("--mcp takes NAME=COMMAND ARGS... (a stdio server), NAME=URL (an HTTP "
             "server) or a JSON object ('{\"name\": ..., \"url\": ..., \"headers\": ...}')")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_URL = re.compile(r"https?://\S+\Z", re.I)

mcp_option = click.option(
    "--mcp", "mcp_specs", multiple=True, metavar="NAME=COMMAND|NAME=URL|JSON",
    help="An MCP server whose tools the agent may call (repeatable): 'NAME=COMMAND ARGS' "
         "starts it inside the sandbox, 'NAME=https://...' reaches it over HTTP, a JSON "
         "object gives any field (headers, tools...). Secrets as <secret:NAME>.")
secret_option = click.option(
    "--secret", "secret_names", multiple=True, metavar="NAME",
    help="Give the session the secret NAME (repeatable): its value is read from this "
         "shell's variable NAME, never from the command line; masked everywhere.")


@dataclass(frozen=True)
class GivenServer:
    """One server for the session, and where it was given."""

    entry: dict[str, Any]
    source: str
    """``flag`` or the file's path, as ``config show`` names sources."""
    yours: bool
    """Written by the user (a flag, their own file): its placeholders are given secrets."""

    @property
    def name(self) -> str:
        return str(self.entry.get("name") or McpServer.model_validate(self.entry).label)


def parse_mcp_flag(text: str) -> dict[str, Any]:
    """One ``--mcp`` value as a session's ``mcp`` entry; a usage error says what is wrong
    (never quoting the value: it may hold what should have been a placeholder)."""
    if text.lstrip().startswith("{"):
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"not valid JSON ({e.msg} at column {e.colno})",
                                     param_hint="--mcp") from None
        if not isinstance(entry, dict):
            raise click.BadParameter(SPEC_FORM, param_hint="--mcp")
    else:
        name, equals, rest = text.partition("=")
        if not equals or not re.match(NAME_PATTERN, name.strip()):
            raise click.BadParameter(SPEC_FORM + "; NAME: 1 to 32 letters, digits, _ or -",
                                     param_hint="--mcp")
        entry = {"name": name.strip(), **_server_of(rest.strip(), name.strip())}
    label = f"--mcp {entry.get('name') or ''}".rstrip()
    if pasted := literal_secrets(entry):
        raise click.BadParameter(f"{pasted[0]}: a secret never goes on the command line (every "
                                 "user of this machine can read it): write <secret:NAME> "
                                 "and give --secret NAME", param_hint=label)
    try:
        McpServer.model_validate(entry)
    except ValidationError as e:
        item = e.errors()[0]
        where = ".".join(str(part) for part in item["loc"])
        reason = item["msg"].removeprefix("Value error, ")
        raise click.BadParameter(f"{where}: {reason}" if where else reason,
                                 param_hint=label) from None
    return entry


def _server_of(rest: str, name: str) -> dict[str, Any]:
    if _URL.match(rest):
        return {"url": rest}
    try:
        words = shlex.split(rest)
    except ValueError as e:
        raise click.BadParameter(f"{e} (quote as in a shell)", param_hint=f"--mcp {name}") \
            from None
    env = {}
    while words and _ASSIGNMENT.match(words[0]):
        variable, _, value = words.pop(0).partition("=")
        env[variable] = value
    if not words:
        raise click.BadParameter("give the server's program after NAME= (or an http:// URL)",
                                 param_hint=f"--mcp {name}")
    return {"command": words, **({"env": env} if env else {})}


def given_servers(files: ConfigFiles, specs: tuple[str, ...]) -> list[GivenServer]:
    """The files' servers, then the flags' (a flag's replaces a file's of its name)."""
    project = files.project.label if files.project is not None else None
    servers = {name: GivenServer(r.value, r.source, r.source != project)
               for name, r in resolve_mcp(files).items()}
    unnamed = []
    for spec in specs:
        entry = parse_mcp_flag(spec)
        server = GivenServer(entry, FLAG, True)
        if entry.get("name"):
            servers.pop(str(entry["name"]), None)  # the flag's comes last, in its order
            servers[str(entry["name"])] = server
        else:
            unnamed.append(server)
    return [*servers.values(), *unnamed]


def session_secrets(servers: list[GivenServer], names: tuple[str, ...],
                    environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The session's secrets: each ``--secret NAME`` and each placeholder of a server you
    wrote, valued from the variable of its name. A usage error names what is missing."""
    env = os.environ if environ is None else environ
    wanted: dict[str, str] = {}  # name -> who asked for it, for the message
    for name in names:
        if "=" in name or not ENV_NAME.match(name):
            raise click.BadParameter(
                "give the secret's NAME only (letters, digits and _): its value is read "
                "from the variable NAME of this shell, never from the command line, where "
                "every user of this machine could read it", param_hint="--secret")
        wanted[name] = f"--secret {name}"
    for server in servers:
        for name in sorted(McpServer.model_validate(server.entry).secret_names()):
            if name in wanted:
                continue
            if not server.yours:
                raise click.UsageError(
                    f"the MCP server {server.name!r} of {server.source} names <secret:{name}>;"
                    f" a project file's server gets a secret only when you give it: "
                    f"--secret {name}")
            wanted[name] = f"the MCP server {server.name!r} ({_origin(server)}) names " \
                           f"<secret:{name}>"
    values = {}
    for name, why in wanted.items():
        value = env.get(name, "")
        if not value:
            raise click.UsageError(f"{why}: its value is read from the variable {name}, "
                                   f"which is not set here: export {name}=... in this shell")
        values[name] = value
    return values


def _origin(server: GivenServer) -> str:
    return "given as a flag" if server.source == FLAG else f"from {server.source}"


def mcp_options(files: ConfigFiles, specs: tuple[str, ...],
                secret_names: tuple[str, ...]) -> dict[str, Any]:
    """``mcp`` and ``secrets`` for ``start_session``, those that are not empty."""
    servers = given_servers(files, specs)
    secrets = session_secrets(servers, secret_names)
    options: dict[str, Any] = {}
    if servers:
        options["mcp"] = [server.entry for server in servers]
    if secrets:
        options["secrets"] = secrets
    return options
