"""``trouper diff``: what the agent changed in a session's workspace since it started.

Through the home's daemon when one runs (``GET /v1/sessions/{id}/diff``), else read from
the home itself (the session's baseline and its workspace: no actor system). stdout gets
only the diff (a unified diff, or with ``--stat`` a summary, or ``--json``), so it can be
piped or saved; what was left out, and why, goes to stderr.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .clients import reading
from .support import SESSION_FAILED, CliError, home_option, open_home


@click.command("diff")
@click.argument("session_id")
@home_option
@click.option("--stat", is_flag=True, help="A summary: one line a file, then the totals.")
@click.option("--json", "as_json", is_flag=True, help="The whole comparison as one JSON "
              "object (files, patches, notes; available false with a reason).")
def diff(session_id: str, home: Path | None, stat: bool, as_json: bool) -> None:
    """Show what the agent changed in a session's workspace since the session started.

    A unified diff on stdout (binary files read "binary file changed"); what was not
    compared (ignored paths, files over the size limit) on stderr. Through the home's
    daemon when one runs. Exit 1 when no diff can be made, saying why (a session from
    before baselines, a workspace on a runtime server's machine).
    """
    trouper_home = open_home(home)
    with reading(trouper_home) as client:
        changes = client.session(session_id).diff()
    if as_json:
        click.echo(json.dumps(changes.to_json()))
        return
    if not changes.available:
        raise CliError(f"no diff of session {session_id}: {changes.reason}", SESSION_FAILED)
    for change in changes.files:
        if change.left_out:
            click.echo(f"trouper: {change.path}: not compared ({change.left_out})", err=True)
    for note in changes.notes:
        click.echo(f"trouper: {note}", err=True)
    if not changes.files:
        click.echo(f"trouper: no changes since {changes.base}", err=True)
        return
    click.echo(changes.stat() if stat else changes.patch(), nl=False)


__all__ = ["diff"]
