"""The console every command prints through: rich in a terminal, plain text elsewhere.

In a terminal lines wrap at its width, with colour. Sent to a file, a pipe or a CI log
(stdout is no TTY), nothing wraps (a printed ``trouper resume ...`` line stays whole
however long) and no ANSI code is written. ``NO_COLOR`` (set and not empty) and
``TERM=dumb`` turn colour and styles off in a terminal too.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console


def plain_wanted() -> bool:
    """Whether the user asked for no colour and no styles (``NO_COLOR``, ``TERM=dumb``)."""
    return bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"


def interactive() -> bool:
    """Whether a person sits at this command: stdin and stdout are both a terminal."""
    return _isatty(sys.stdin) and _isatty(sys.stdout)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (OSError, ValueError):  # closed, or not a real file
        return False


def make_console() -> Console:
    """A Console for stdout as it is now: see the module's doc."""
    made = Console(highlight=False, color_system=None if plain_wanted() else "auto")
    if not made.is_terminal:
        made.soft_wrap = True  # lines as long as they are
    return made


class FirstUseConsole:
    """The Console, made on first use: it reads the terminal's width and colour settings
    (COLUMNS, NO_COLOR...) then, not when this module is imported."""

    _console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if FirstUseConsole._console is None:
            FirstUseConsole._console = make_console()
        return getattr(FirstUseConsole._console, name)


console: Console = FirstUseConsole()  # type: ignore[assignment]


__all__ = ["FirstUseConsole", "console", "interactive", "make_console", "plain_wanted"]
