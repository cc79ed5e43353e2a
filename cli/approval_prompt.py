"""Asking the person at the terminal about an action that waits for approval.

``ask`` shows the held action and why the policy held it, then asks::

    Run it? [y]es / [n]o / n with a reason:

``y`` approves; ``n`` rejects (a second prompt asks why; Enter gives no reason);
``n <reason>`` rejects with that reason, which the agent reads. Anything else asks again:
a held action never runs on a stray Enter, nor on anything typed before it was shown.
Reading waits on stdin in steps of 0.1 s, so a signal (Ctrl-C) or the end of input
(Ctrl-D) ends the question at once, leaving the action waiting.
"""

from __future__ import annotations

import os
import select
import termios
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text

from .console import console

if TYPE_CHECKING:
    from ..client.protocol import SessionHandle
    from ..messages.events import ActionEvent

PROMPT = "Run it? [y]es / [n]o / n with a reason: "
WHY_PROMPT = "Why not? (the agent reads it; Enter for no reason): "
AGAIN = "answer y, n, or n followed by the reason"
_POLL_S = 0.1
SHOWN_LINES = 12
"""Lines of a file action's content shown above the prompt (each side of an edit)."""
THOUGHT_CHARS = 300


@dataclass(frozen=True)
class Answer:
    """The user's verdict on the action shown."""

    approved: bool
    reason: str = ""
    """Why it was rejected (the agent reads it); empty when approved or none was given."""


def parse(line: str) -> Answer | str | None:
    """``Answer`` for a complete answer, ``WHY_PROMPT`` when a bare no needs its reason
    asked, None for a line that is no answer."""
    text = line.strip()
    word, _, rest = text.partition(" ")
    word = word.lower()
    if word in ("y", "yes") and not rest.strip():
        return Answer(True)
    if word in ("n", "no"):
        return Answer(False, rest.strip()) if rest.strip() else WHY_PROMPT
    return None


class TerminalLines:
    """Lines from a file descriptor (stdin), read without blocking past ``stop``."""

    def __init__(self, fd: int = 0) -> None:
        self._fd = fd
        self._buffer = b""

    def drop_typed_ahead(self) -> None:
        """Forget what was typed before the question was shown: a key pressed while the
        session ran (an Enter, a ``y`` meant for something else) never answers it."""
        self._buffer = b""
        if os.isatty(self._fd):
            termios.tcflush(self._fd, termios.TCIFLUSH)

    def readline(self, stop: threading.Event) -> str | None:
        """The next line without its newline; None when ``stop`` is set or input ended."""
        while b"\n" not in self._buffer:
            if stop.is_set():
                return None
            ready, _, _ = select.select([self._fd], [], [], _POLL_S)
            if not ready:
                continue
            try:
                chunk = os.read(self._fd, 4096)
            except OSError:  # the terminal is gone, said as EIO rather than end of input
                return None
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace").rstrip("\r")


def show(action: str, held_because: str | None, body: list[Text] | None = None,
         thought: str = "") -> None:
    """The agent's reason, the action, what it would write, and why it waits, above the
    prompt."""
    console.print(Text("waiting for your approval", style="bold magenta"))
    if thought:
        console.print(Text.assemble(("  thought ", "dim"), (thought, "italic")))
    console.print(Text.assemble(("  action  ", "dim"), action))
    for line in body or []:
        console.print(Text.assemble("          ", line))
    if held_because:
        console.print(Text.assemble(("  held    ", "dim"), held_because))


def body_of(event: ActionEvent) -> list[Text]:
    """What a file action would write (``+`` lines) or replace (``-`` lines), masked and
    cut to ``SHOWN_LINES`` each: enough to judge it at the prompt."""
    from ..security.masking import known_masker

    action = known_masker().mask_event(event).action
    kind = getattr(action, "kind", "")
    if kind == "write_file":
        return _marked(action.content, "+", "green")
    if kind == "edit_file":
        return _marked(action.old, "-", "red") + _marked(action.new, "+", "green")
    return []


def thought_of(event: ActionEvent) -> str:
    """What the agent said alongside the action, masked, on one line of at most
    ``THOUGHT_CHARS``."""
    from ..security.masking import known_masker

    thought = " ".join(known_masker().mask_event(event).thought.split())
    return thought if len(thought) <= THOUGHT_CHARS else thought[:THOUGHT_CHARS - 1] + "…"


def _marked(text: str, mark: str, style: str) -> list[Text]:
    lines = text.splitlines() or [""]
    shown = [Text(f"{mark} {line}", style=style) for line in lines[:SHOWN_LINES]]
    if len(lines) > SHOWN_LINES:
        shown.append(Text(f"  … {len(lines) - SHOWN_LINES} more lines", style="dim"))
    return shown


def ask(event: ActionEvent, held_because: str | None, lines: TerminalLines,
        stop: threading.Event) -> Answer | None:
    """Show ``event`` and ask until an answer comes; None on a signal or end of input."""
    from .render import describe_action

    show(describe_action(event), held_because, body_of(event), thought_of(event))
    lines.drop_typed_ahead()
    prompt = PROMPT
    while True:
        console.print(Text(prompt, style="bold"), end="")
        console.file.flush()
        line = lines.readline(stop)
        if line is None:
            console.print()
            return None
        if prompt == WHY_PROMPT:
            return Answer(False, line.strip())
        parsed = parse(line)
        if isinstance(parsed, Answer):
            return parsed
        if parsed is None:
            console.print(Text(AGAIN, style="yellow"))
        prompt = parsed or PROMPT


def answer_waiting(session: SessionHandle, lines: TerminalLines, stop: threading.Event,
                   not_again: str = "") -> str:
    """Ask about the action ``session`` waits to have approved and give it the answer;
    return that action's id, or "" when none waits (or it is ``not_again``, asked
    already), the user left the prompt (a signal, end of input), or another client
    answered first."""
    from ..config.confirmation import needs_confirmation
    from ..exceptions import InvalidRequest

    info = session.info()
    waiting = info.awaiting_confirmation
    if waiting is None or waiting.action_id == not_again:
        return ""
    held = needs_confirmation(info.config.confirm, waiting.action) if waiting.action else None
    answer = ask(waiting, held, lines, stop)
    if answer is None:
        return ""
    try:
        if answer.approved:
            session.approve(waiting.action_id)
        else:
            session.reject(answer.reason, waiting.action_id)
    except InvalidRequest as exc:  # answered meanwhile (the page, another terminal)
        console.print(Text(f"not answered here: {exc}", style="yellow"))
        return ""
    return waiting.action_id


__all__ = ["AGAIN", "PROMPT", "WHY_PROMPT", "Answer", "TerminalLines", "answer_waiting", "ask",
           "body_of", "parse", "show", "thought_of"]
