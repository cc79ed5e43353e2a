"""Events as short, readable lines for a terminal (used by the CLI).

Every event is masked with the secret values this process knows before anything of it is
shown or clipped, so a clip never leaves half a secret (the store holds masked events
already; this guards what came another way).
"""

from __future__ import annotations

import json

from rich.text import Text

from ..messages.events import (
    ActionEvent,
    AgentState,
    ConfirmationEvent,
    Event,
    LLMCompleted,
    LLMRetry,
    McpToolsListed,
    MessageEvent,
    ObservationEvent,
    RuntimeEvent,
    StateChanged,
)
from ..security.masking import known_masker

_STATE_STYLE = {
    AgentState.FINISHED: "bold green",
    AgentState.ERROR: "bold red",
    AgentState.STOPPED: "bold yellow",
    AgentState.RATE_LIMITED: "yellow",
    AgentState.PAUSED: "yellow",
}
_STATUS_STYLE = {"ok": "green", "error": "red", "lost": "bold red", "rejected": "magenta",
                 "interrupted": "yellow"}


def _styled(text: str, style: str) -> Text:
    """``text`` in ``style`` as a span, not as the base style: what is appended to it
    keeps its own style (``Text(text, style=...) + more`` would paint ``more`` too)."""
    return Text.assemble((text, style))


def _clip(text: str, limit: int) -> str:
    text = text.rstrip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_action(event: ActionEvent) -> str:
    """``run: ls -la`` style summary of an action."""
    event = known_masker().mask_event(event)
    action = event.action
    if action is None:
        return f"{event.tool}({_clip(event.arguments, 80)})  [malformed]"
    fields = action.model_dump(exclude={"kind"}, exclude_none=True, exclude_defaults=True)
    if action.kind == "run":
        return f"run: {action.command}" if action.command else "run: (wait for more output)"
    if action.kind == "think":
        return f"think: {_clip(action.thought, 100)}"
    if action.kind == "finish":
        return "finish"
    if action.kind == "mcp":
        return f"mcp {action.server}.{action.tool} " + _clip(
            json.dumps(action.arguments, ensure_ascii=False), 100)
    if action.kind == "mcp_tools":
        names = ", ".join(server.name or server.label for server in action.servers)
        return f"start MCP servers: {names}"
    if "path" in fields:
        return f"{action.kind}: {fields['path']}"
    return f"{action.kind}: {_clip(json.dumps(fields, ensure_ascii=False), 100)}"


def render(event: Event, *, verbose: bool = False) -> Text | None:
    """One event as a line (or a few), or None when it is not worth showing."""
    event = known_masker().mask_event(event)
    seq = _styled(f"{event.seq:>4} ", "dim")
    if isinstance(event, StateChanged):
        line = Text(f"state → {event.state.value}", style=_STATE_STYLE.get(event.state, "cyan"))
        if event.reason:
            line.append(f"  ({event.reason})", style="dim")
        return seq + line
    if isinstance(event, MessageEvent):
        who = "user" if event.source == "user" else "agent"
        return seq + Text(f"{who}: ", style="bold") + Text(_clip(event.text, 400))
    if isinstance(event, ActionEvent):
        line = _styled("▶ ", "bold blue") + Text(describe_action(event))
        if event.thought and verbose:
            line = _styled(f"  {_clip(event.thought, 200)}\n", "italic dim") + seq + line
        return seq + line
    if isinstance(event, ObservationEvent):
        return seq + _render_outcome(event, verbose)
    if isinstance(event, McpToolsListed):
        return _render_mcp_tools(event, seq)
    if isinstance(event, LLMRetry):
        return seq + Text(
            f"model retry {event.attempt}/{event.max_attempts} in {event.wait_s:.1f} s: "
            f"{event.error_class}", style="yellow")
    if isinstance(event, RuntimeEvent):
        return seq + Text(f"sandbox {event.phase} {event.detail}".rstrip(), style="dim")
    if isinstance(event, ConfirmationEvent):
        verdict = "approved" if event.approved else "rejected"
        return seq + Text(f"user {verdict} the action {event.action_id}", style="bold") + (
            Text(f": {_clip(event.reason, 200)}", style="dim") if event.reason else Text())
    if isinstance(event, LLMCompleted) and verbose:
        return seq + Text(
            f"model {event.model}: {event.prompt_tokens}+{event.completion_tokens} tokens, "
            f"{event.latency_s * 1000:.0f} ms", style="dim")
    return None


def _render_mcp_tools(event: McpToolsListed, seq: Text) -> Text:
    """A line per server: the tools it offers (``mcp t: 2 tools (echo, env)``), or why it
    did not start, as a warning."""
    offered: dict[str, list[str]] = {}
    for tool in event.tools:
        offered.setdefault(tool.server, []).append(tool.tool)
    lines = [Text(f"mcp {server}: {len(tools)} tool{'s' if len(tools) != 1 else ''} "
                  f"({_clip(', '.join(tools), 120)})", style="cyan")
             for server, tools in offered.items()]
    lines += [Text(f"warning: mcp {server} did not start: {_clip(why, 300)}", style="yellow")
              for server, why in event.failed.items()]
    if not lines:
        lines = [Text("mcp: no tools offered", style="cyan")]
    return Text("\n").join(seq + line for line in lines)


def _render_outcome(event: ObservationEvent, verbose: bool) -> Text:
    outcome = event.outcome
    head = _styled("  ↳ ", "dim") + Text(outcome.status, style=_STATUS_STYLE[outcome.status])
    if outcome.exit_code is not None:
        head.append(f" exit {outcome.exit_code}", style="dim")
    if outcome.timed_out:
        head.append(f" timed out ({outcome.timed_out})", style="yellow")
    body = outcome.content.strip()
    if body:
        lines = body.splitlines()
        shown = lines if verbose else lines[:6]
        head.append("\n" + "\n".join(f"       {_clip(line, 160)}" for line in shown))
        if len(shown) < len(lines):
            head.append(f"\n       … {len(lines) - len(shown)} more lines", style="dim")
    return head
