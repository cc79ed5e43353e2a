"""The commands that carry a session on, exactly as a user types them.

Printed in the summary, after an interrupt, and by ``events --follow``: each is one line
that works pasted as it is, with what it needs to carry on (``--script FILE`` for a
scripted model served by the command, ``--home DIR`` for a home named on the command
line), every argument quoted for a POSIX shell.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..home.paths import Home, default_home
from ..messages.events import AgentState

REASON_PLACEHOLDER = "WHY"
"""Stands for the reason in a printed ``reject`` command."""


def carry_on_flags(home: Home, script: Path | str | None = None) -> str:
    """`` --script FILE --home DIR``, each only where the command needs it: ``script``
    given (a placeholder ``FILE`` is printed as it is), ``home`` not the default one."""
    flags = ""
    if script is not None:
        flags += f" --script {shlex.quote(str(script))}"
    if _resolved(home.root) != _resolved(default_home()):
        flags += f" --home {shlex.quote(str(home.root))}"
    return flags


def _resolved(path: Path) -> Path:
    return path.expanduser().resolve()


def approve_command(session_id: str, flags: str = "") -> str:
    return f"trouper approve {session_id}{flags}"


def reject_command(session_id: str, flags: str = "") -> str:
    return f"trouper reject {session_id} '{REASON_PLACEHOLDER}'{flags}"


def resume_command(session_id: str, flags: str = "") -> str:
    return f"trouper resume {session_id}{flags}"


def next_rows(session_id: str, state: AgentState, flags: str = "",
              cause: str | None = None) -> list[tuple[str, str]]:
    """The summary's rows that say how to go on from ``state``: ``approve`` and ``reject``
    for an action waiting for approval, else ``resume`` (with a message where the agent
    asked for one, or where it was paused as stuck: the user's hint)."""
    if state == AgentState.AWAITING_USER_CONFIRMATION:
        return [("approve", approve_command(session_id, flags)),
                ("reject", reject_command(session_id, flags))]
    command = resume_command(session_id, flags)
    if state == AgentState.AWAITING_USER_INPUT:
        command += " -m 'YOUR ANSWER'"
    elif state == AgentState.PAUSED and cause == "stuck":
        command += " -m 'YOUR HINT'"
    elif state == AgentState.PAUSED and cause == "budget_ask":
        return [("budget", f"trouper budget {session_id} --max-cost-usd USD "
                           f"--max-iterations N{flags}")]
    return [("resume", command)]


def how_to_go_on(session_id: str, state: AgentState, flags: str = "",
                 cause: str | None = None) -> str:
    """``next_rows`` as the end of a sentence about the session, for a line on stderr:
    ``waits for your approval: trouper approve ...`` or ``can be resumed with: ...``."""
    if state == AgentState.AWAITING_USER_CONFIRMATION:
        return (f"waits for your approval: {approve_command(session_id, flags)}  (or, to "
                f"refuse it: {reject_command(session_id, flags)})")
    return f"can be resumed with: {next_rows(session_id, state, flags, cause)[0][1]}"


__all__ = ["REASON_PLACEHOLDER", "approve_command", "carry_on_flags", "how_to_go_on",
           "next_rows", "reject_command", "resume_command"]
