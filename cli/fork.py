"""``trouper fork ID [--at N] [-m HINT]``: a new session that starts where ID was at event
N, its files included (docs/time-travel.md), with or without a daemon.

Without ``-m`` the fork waits, paused, and the command prints its id and how its
workspace was made. With ``-m`` it carries on with the hint at once: through the home's
daemon the command returns (the session goes on there); without one it is followed here
until it settles, as ``resume`` does (a scripted session needs its ``--script FILE``
again: the fork asks the same model as the original).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from .answer import script_option, timeout_option
from .carry_on import carry_on
from .clients import driving
from .run_defaults import chosen, read_files
from .support import debug_enabled, home_option, log_to_home, open_home, verbose_option

if TYPE_CHECKING:
    from ..client.protocol import SessionHandle


@click.command()
@click.argument("session_id")
@click.option("--at", "at_seq", type=click.IntRange(min=1), metavar="N",
              help="The event to fork at (its seq, as 'trouper events' or 'trouper audit' "
                   "show it); default: the session's last.")
@click.option("-m", "--message", metavar="HINT",
              help="Carry the fork on at once with this message; without it, it waits.")
@script_option
@home_option
@timeout_option
@verbose_option
def fork(session_id: str, at_seq: int | None, message: str | None, script: Path | None,
         home: Path | None, timeout_s: float, verbose: bool) -> None:
    """Start a new session where SESSION_ID was at event N, its files included.

    The original is untouched. An action that was in flight at N is not run by the fork.
    """
    trouper_home = open_home(home)
    choice = driving(trouper_home, daemon=None)
    if choice.daemon_url is not None:
        with choice.open() as client:
            new = client.fork(session_id, at_seq, message)
            info = new.info()
            click.echo(f"{session_id} forked as {new.id}: {info.state.value}")
        return
    from ..client.fork import fork_session
    from ..client.session import new_session_id
    from ..store import open_store

    store = open_store(trouper_home)
    try:  # paused: the hint goes as a message, then a resume, once its actors run here
        made = fork_session(trouper_home, store, session_id, new_session_id(),
                            at_seq=at_seq)
    finally:
        store.close()
    click.echo(f"{session_id} forked at event {made.at_seq} as {made.session_id}; its "
               f"workspace: {made.files}")
    if not (message and message.strip()):
        click.echo(f"it waits: 'trouper resume {made.session_id} -m HINT' carries it on")
        return
    log_to_home(trouper_home, debug_enabled())
    files = read_files(home, Path.cwd())
    timeout_s = chosen(click.get_current_context(), files, "timeout")["timeout"].value

    def carry_on_with_the_hint(session: SessionHandle) -> object:
        session.send(message or "")
        return session.resume()

    code = carry_on(trouper_home, made.session_id, script, carry_on_with_the_hint,
                    timeout_s=timeout_s, verbose=verbose)
    click.get_current_context().exit(code)


__all__ = ["fork"]
