"""``trouper audit``: every action of a session, each attempt of it and which sandbox ran
it, and what became of it (docs/audit.md).

Derived from the session's log (``client/audit.py``), read through the home's daemon when
one runs, else from the store (no actor system), as ``trouper events`` reads it. stdout
gets the audit only, so ``--json`` can be piped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.text import Text

from ..security.secrets_file import remember_session_secrets
from .clients import reading
from .console import console
from .support import home_option, open_home

if TYPE_CHECKING:
    from ..client.audit import ActionAudit

_STATUS_STYLE = {"ok": "green", "error": "red", "lost": "bold red", "rejected": "magenta",
                 "interrupted": "yellow"}


@click.command("audit")
@click.argument("session_id")
@home_option
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: {\"actions\": [...]}, as the daemon's route answers.")
def audit(session_id: str, home: Path | None, as_json: bool) -> None:
    """Show every action of a session: who asked it, each attempt with the sandbox epoch
    it went to, the sandbox process that ran it, and its outcome with the cause.

    Read from the session's log; through the home's daemon when one runs.
    """
    from ..client.audit import audit as derive
    from ..security.masking import known_masker

    trouper_home = open_home(home)
    with reading(trouper_home) as client:
        session = client.session(session_id)  # unknown: an error before anything is printed
        remember_session_secrets(trouper_home, session_id)
        masker = known_masker()
        actions = derive(masker.mask_event(event) for event in session.events())
    if as_json:
        click.echo(json.dumps({"actions": [a.model_dump(mode="json") for a in actions]}))
        return
    if not actions:
        click.echo(f"trouper: session {session_id} has no actions yet", err=True)
        return
    for action in actions:
        for line in lines(action):
            console.print(line)


def lines(action: ActionAudit) -> list[Text]:
    """An action's audit as terminal lines: the intent, each attempt, the outcome."""
    head = Text.assemble((f"#{action.seq:<5}", "dim"), (action.summary, "bold"),
                         (f"  asked by {action.asked_by}", "dim"))
    shown = [head]
    for n, attempt in enumerate(action.attempts, 1):
        epoch = "no sandbox" if attempt.epoch is None else f"epoch {attempt.epoch}"
        ran = f"; ran it: {attempt.server or 'this sandbox'}" if attempt.started_it else ""
        shown.append(Text(f"       attempt {n}: {attempt.kind} under {epoch} "
                          f"({attempt.why}){ran}", style="dim"))
    if action.status is None:
        shown.append(Text.assemble("       ", ("no outcome", "yellow"), f": {action.cause}"))
        return shown
    facts = [f"{action.duration_s:.2f} s"] if action.duration_s is not None else []
    if action.output_chars is not None:
        facts.append(f"{action.output_chars} chars of output")
    if action.checkpoint:
        facts.append(f"checkpoint {action.checkpoint}")
    shown.append(Text.assemble(
        (f"       outcome #{action.outcome_seq}: ", "dim"),
        (action.status, _STATUS_STYLE.get(action.status, "")), f": {action.cause}",
        (f"  ({', '.join(facts)})" if facts else "", "dim")))
    return shown


__all__ = ["audit", "lines"]
