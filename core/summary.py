"""The summarizing condenser: when a session's prompt grows past ``summarize_at_tokens``,
its older half is summarized by a model before the next question, and the summary is
recorded (``PromptCondensed`` with its ``summary``) so a restored session rebuilds the
same prompt and never pays for the same summary twice.

Pure helpers: when a summary is due, and the request that asks for one. The core
(``core/loop.py``) sends it as any model call (its cost is the session's) and records the
answer.
"""

from __future__ import annotations

import json
from typing import Any

from ..agent.condense import HEAD, choose_cut, condensed
from ..config.models import SessionConfig

CHARS_PER_TOKEN = 4
INSTRUCTIONS = (
    "You summarize the older part of a coding agent's working session so that the agent "
    "can go on without it. Keep: what the user asked and every requirement they added; "
    "the decisions made and why; the files created or changed; the commands that failed "
    "and every error that is not resolved yet; what is left to do. Leave out what no "
    "longer matters. Answer with the summary only, in plain text, as short as it can be.")


def estimated_tokens(messages: list[dict[str, Any]]) -> int:
    """A model-free estimate of a prompt's tokens (its characters / 4)."""
    chars = 0
    for message in messages:
        chars += len(str(message.get("content") or ""))
        if message.get("tool_calls"):
            chars += len(json.dumps(message["tool_calls"]))
    return chars // CHARS_PER_TOKEN


def due_cut(config: SessionConfig, messages: list[dict[str, Any]], cut: int,
            summary: str) -> int | None:
    """The cut to summarize up to, when the prompt as it would be sent passes the
    threshold; None when no summary is due (or nothing can be dropped)."""
    if config.condenser != "summarize":
        return None
    if estimated_tokens(condensed(messages, cut, summary)) <= config.summarize_at_tokens:
        return None
    return choose_cut(messages, cut)


def summary_messages(messages: list[dict[str, Any]], cut: int, new_cut: int,
                     summary: str) -> list[dict[str, Any]]:
    """The request for a summary of ``messages[HEAD:new_cut]``: the summary so far (of
    what was before ``cut``) and the transcript of what comes after it."""
    lines = [f"Summary so far:\n{summary}\n"] if summary else []
    for message in messages[max(HEAD, cut):new_cut]:
        text = str(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            text += f"\n[calls {function.get('name')}({function.get('arguments')})]"
        lines.append(f"{message.get('role')}: {text}")
    return [{"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": "The session so far:\n\n" + "\n".join(lines)}]
