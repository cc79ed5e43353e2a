"""A session's MCP servers as its log records them (pure: an outcome in, events out).

The sandbox answers the setup step ``mcp_tools`` with a JSON listing, per server, of its
tools or of why it did not start. The session records, in one append, a short outcome
(what the prompt shows: each server and its tools, or why it failed) and
``McpToolsListed`` (what the model is offered from then on, restart or not). A required
server that did not start fails the setup, naming it. A listing lost with its sandbox
ran nothing anyone could repeat by mistake (listing has no effect), so it is asked again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..messages.actions import ListMcpTools
from ..messages.events import ActionEvent, McpToolsListed
from ..messages.mcp import McpServer, McpTool, tools_of
from ..messages.outcomes import Outcome

MAX_WHY_CHARS = 2000
"""How much of a server's failure (its error and the end of its stderr) is kept."""
MAX_LISTINGS = 3
"""Listings a session asks for before a lost one fails its setup (a server whose start
kills its sandbox would otherwise be started for ever)."""
AGAIN = "-again"
"""Marks a listing asked again (in its ``tool_call_id``), so a restored core counts them."""
SHOWN_TOOLS = 20
"""Tool names the outcome lists per server before "and N more"."""


def listing_recorded(event: ActionEvent, outcome: Outcome, new_id: Callable[[], str]
                     ) -> tuple[Outcome, list[Any]]:
    """The outcome to record for the listing ``event`` and the events to append with it:
    ``McpToolsListed``; or, when the listing was lost, the same step again (a new id)."""
    action = event.action
    assert isinstance(action, ListMcpTools)
    if outcome.status == "lost" and event.tool_call_id.count(AGAIN) < MAX_LISTINGS - 1:
        again = event.model_copy(update={"action_id": new_id(), "seq": 0,
                                         "tool_call_id": f"{event.tool_call_id}{AGAIN}"})
        return outcome, [again]
    if outcome.status != "ok":
        return outcome, []
    servers = _listing(outcome.content)
    if servers is None:
        return Outcome(status="error", content=(
            "The sandbox's listing of the MCP servers could not be read: "
            f"{outcome.content[:300]}")), []
    tools, failed = offered(action.servers, servers)
    listed = McpToolsListed(action_id=event.action_id, tools=tuple(tools), failed=failed)
    return _summary(action.servers, tools, failed), [listed]


def offered(servers: tuple[McpServer, ...], listing: dict[str, Any]
            ) -> tuple[list[McpTool], dict[str, str]]:
    """The tools offered to the model, and the servers that failed -> why."""
    taken: set[str] = set()
    tools: list[McpTool] = []
    failed: dict[str, str] = {}
    for server in servers:
        name = server.name or server.label
        entry = listing.get(name)
        if not isinstance(entry, dict):
            failed[name] = "the sandbox did not list it"
        elif entry.get("error"):
            failed[name] = str(entry["error"])[:MAX_WHY_CHARS]
        else:
            listed = entry.get("tools")
            tools += tools_of(server, listed if isinstance(listed, list) else [], taken)
    return tools, failed


def _listing(content: str) -> dict[str, Any] | None:
    try:
        servers = json.loads(content)["servers"]
    except (ValueError, KeyError, TypeError):
        return None
    return servers if isinstance(servers, dict) else None


def _summary(servers: tuple[McpServer, ...], tools: list[McpTool],
             failed: dict[str, str]) -> Outcome:
    """Required failures first (the first line is the reason the setup failed), then
    each server's tools, then the optional failures."""
    lines, later = [], []
    for server in servers:
        name = server.name or server.label
        if name in failed:
            line = f"The MCP server {name!r} did not start: {failed[name]}"
            if server.required:
                lines.append(line)
            else:
                later.append(f"{line}\n(It is optional: the session goes on without its "
                             "tools.)")
            continue
        mine = [tool.name for tool in tools if tool.server == name]
        shown = ", ".join(mine[:SHOWN_TOOLS]) + (
            f" and {len(mine) - SHOWN_TOOLS} more" if len(mine) > SHOWN_TOOLS else "")
        later.append(f"The MCP server {name!r} offers {len(mine)} tool"
                     f"{'' if len(mine) == 1 else 's'}{': ' + shown if mine else ''}.")
    status = "error" if lines else "ok"
    return Outcome(status=status, content="\n".join(lines + later))
