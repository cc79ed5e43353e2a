"""Condensing a prompt that no longer fits the model's context window.

The prompt keeps the system message, the task (the first user message), a marker saying
what was dropped, and the latest messages from a *cut* on. The cut is an index into the
full message list the ``PromptBuilder`` keeps (which only ever grows), so once recorded in
the log (``PromptCondensed``) it means the same after a restart. The log itself keeps
everything.
"""

from __future__ import annotations

from typing import Any

HEAD = 2
"""Messages always kept from the start: the system message and the task."""


def choose_cut(messages: list[dict[str, Any]], previous_cut: int = 0) -> int | None:
    """A new cut that drops about half of what the current prompt carries after the head.

    Never cuts between an assistant message and the tool results that answer it, and
    always keeps at least the latest message. None when there is nothing left to drop.
    """
    start = max(HEAD, previous_cut)
    if len(messages) - start < 2:
        return None
    cut = start + (len(messages) - start) // 2
    while cut < len(messages) and messages[cut].get("role") == "tool":
        cut += 1  # a tool result must follow its assistant message
    if cut >= len(messages) or cut <= start:
        return None
    return cut


def condensed(messages: list[dict[str, Any]], cut: int,
              summary: str = "") -> list[dict[str, Any]]:
    """The prompt with ``messages[HEAD:cut]`` replaced by one marker message: the
    ``summary`` of what they said, when the summarizing condenser made one."""
    if cut <= HEAD:
        return messages
    dropped = cut - HEAD
    if summary:
        content = (f"[Context condensed: the {dropped} earlier messages of this session are "
                   f"summarized here. The task is above; the latest steps follow.]\n\n"
                   f"{summary}")
    else:
        content = (
            f"[Context condensed: {dropped} earlier messages of this session were dropped to "
            "fit the model's context window. The task is above; the latest steps follow. "
            "Re-read files rather than relying on what you may remember of them.]")
    return [*messages[:HEAD], {"role": "user", "content": content}, *messages[cut:]]
