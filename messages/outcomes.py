"""What became of an action: one ``Outcome`` with a status (I1 in docs/promises.md)."""

from __future__ import annotations

from typing import Literal

from .base import Frozen

OutcomeStatus = Literal["ok", "error", "interrupted", "rejected", "lost"]
"""``ok``: it ran (a non-zero exit code is still ``ok``: it is data for the agent).
``error``: it could not do its job (missing file, path outside the workspace, hard timeout).
``interrupted``: stopped part-way by a user's pause/stop or an interrupt.
``rejected``: never sent to a runtime (malformed tool call, refused by the user).
``lost``: it may have run, and nobody can know its result (never re-run: promise I2)."""


class Outcome(Frozen):
    """The result of one action, as the agent will see it."""

    status: OutcomeStatus
    content: str
    """The text the agent sees (already truncated to head and tail where long)."""
    exit_code: int | None = None
    """The shell's exit status for ``run``; ``None`` for file actions or when unknown."""
    timed_out: Literal["hard", "soft"] | None = None
    """``hard``: the command was killed; ``soft``: no output for a while, still running."""
    still_running: bool = False
    """The command goes on after this outcome (soft timeout); an empty ``run`` waits for it."""
    elided_chars: int = 0
    """How many characters were cut from the middle of ``content``; 0 means none."""
    full_output_path: str | None = None
    """Workspace-relative file holding the full, untruncated output, when cut."""
    duration_s: float | None = None
    """Wall time the runtime spent on the action."""
    checkpoint: str | None = None
    """The snapshot of the workspace taken once the action ended (its name in the
    sandbox's checkpoint store: the action's id); None when none was taken."""
    # Who ran it, for the audit trail (client/audit.py, docs/audit.md); never prompted.
    epoch: int | None = None
    """The epoch of the proxy that started the action, as the sandbox's journal recorded
    it (the client copies it from the record); None when no sandbox started it."""
    server_pid: int | None = None
    """The process id of the sandbox server that ran the action; None when unknown."""
    boot_id: str | None = None
    """The boot of that sandbox server (its journal's log is named by it): with
    ``server_pid``, which sandbox process ran the action. None when unknown."""
