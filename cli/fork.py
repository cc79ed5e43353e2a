"""``trouper fork ID [--at N] [-m HINT]``: a new session that starts where ID was at event
N, its files included (docs/time-travel.md), with or without a daemon; ``trouper rewind``
the same, the new session then taking ID's place in ``trouper sessions`` (ID stopped if
it is still working: without a daemon, by an actor system of this process).

Without ``-m`` the fork waits, paused, and the command prints its id and how its
workspace was made. With ``-m`` it carries on with the hint at once: through the home's
daemon the command returns (the session goes on there); without one it is followed here
until it settles, as ``resume`` does (a scripted session needs its ``--script FILE``
again: the fork asks the same model as the original).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .answer import script_option, timeout_option
from .carry_on import carry_on
from .clients import driving
from .run_defaults import chosen, read_files
from .support import debug_enabled, home_option, log_to_home, open_home, verbose_option

if TYPE_CHECKING:
    from ..client.protocol import SessionHandle
    from ..home.paths import Home


def _fork_options(command: Callable[..., None]) -> Callable[..., Any]:
    """The arguments ``fork`` and ``rewind`` share."""
    for option in reversed((
            click.argument("session_id"),
            click.option("--at", "at_seq", type=click.IntRange(min=1), metavar="N",
                         help="The event to fork at (its seq, as 'trouper events' or "
                              "'trouper audit' show it); default: the session's last."),
            click.option("-m", "--message", metavar="HINT",
                         help="Carry the new session on at once with this message; "
                              "without it, it waits."),
            script_option, home_option, timeout_option, verbose_option)):
        command = option(command)
    return click.command()(command)


@_fork_options
def fork(session_id: str, at_seq: int | None, message: str | None, script: Path | None,
         home: Path | None, timeout_s: float, verbose: bool) -> None:
    """Start a new session where SESSION_ID was at event N, its files included.

    The original is untouched. An action that was in flight at N is not run by the fork.
    """
    _fork(session_id, at_seq, message, script, home, verbose, rewind=False)


@_fork_options
def rewind(session_id: str, at_seq: int | None, message: str | None, script: Path | None,
           home: Path | None, timeout_s: float, verbose: bool) -> None:
    """Fork SESSION_ID at event N, the fork taking its place in 'trouper sessions'.

    SESSION_ID is stopped if it is still working; its log and files are kept, and
    'trouper sessions --all' still lists it. An action in flight at N is not run.
    """
    _fork(session_id, at_seq, message, script, home, verbose, rewind=True)


def _fork(session_id: str, at_seq: int | None, message: str | None, script: Path | None,
          home: Path | None, verbose: bool, *, rewind: bool) -> None:
    trouper_home = open_home(home)
    choice = driving(trouper_home, daemon=None)
    done = "rewound" if rewind else "forked"
    if choice.daemon_url is not None:
        with choice.open() as client:
            make = client.rewind if rewind else client.fork
            new = make(session_id, at_seq, message)
            info = new.info()
            click.echo(f"{session_id} {done} as {new.id}: {info.state.value}")
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
    click.echo(f"{session_id} {done} at event {made.at_seq} as {made.session_id}; its "
               f"workspace: {made.files}")
    if rewind:
        stopped = _replace_here(trouper_home, session_id, made.session_id)
        click.echo(f"{session_id} {'was stopped and ' if stopped else ''}is replaced: "
                   "'trouper sessions --all' still lists it")
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


def _replace_here(home: Home, session_id: str, new_id: str) -> bool:
    """Mark ``session_id`` replaced by ``new_id``, with no daemon: read from the store
    when it is settled, else stopped first by an actor system of this process (whoever
    ran it loses it). Returns whether it was stopped."""
    from ..client.embedded import Trouper
    from ..client.rewind import replace
    from ..client.store_reader import StoreReader

    with StoreReader(home) as reader:
        original = reader.session(session_id)
        if original.info().settled:  # nothing to stop: the store alone does
            return replace(reader.store, original, new_id)
    with Trouper(home=home.root, resume=False) as trouper:
        return replace(trouper.store, trouper.session(session_id), new_id)


__all__ = ["fork", "rewind"]
