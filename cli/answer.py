"""``trouper approve ID`` and ``trouper reject ID [REASON]``: answer the action a session
waits to have approved (confirmation mode), with or without a daemon.

While the home's daemon runs, the answer goes to it and the command returns at once (the
session goes on there). Without one, the command opens the home in this process, answers
and follows the session until it settles, as ``trouper resume ID --approve`` does (a
scripted session needs its ``--script FILE`` again); in a terminal, a next action that
waits is asked at the prompt. Either way an unknown id or a session with no action
waiting is refused (exit 2) naming its state.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..config.files import KEYS
from .carry_on import DAEMON_SCRIPT, Act, carry_on
from .clients import driving
from .run_defaults import chosen, read_files
from .support import (
    USAGE,
    CliError,
    debug_enabled,
    home_option,
    log_to_home,
    open_home,
    verbose_option,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..home.paths import Home

script_option = click.option(
    "--script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Without a daemon: the script of a session run with --script, served again at "
         "the address the session knows.")
timeout_option = click.option(
    "--timeout", "timeout_s", default=KEYS["timeout"].default, show_default=True,
    envvar=KEYS["timeout"].env,
    help="Without a daemon: stop following after this many seconds (the session is "
         "paused; resume carries it on).")
action_id_option = click.option("--action-id", default="",
                                help="Only if this is the action waiting.")


@click.command()
@click.argument("session_id")
@action_id_option
@script_option
@home_option
@timeout_option
@verbose_option
def approve(session_id: str, action_id: str, script: Path | None, home: Path | None,
            timeout_s: float, verbose: bool) -> None:
    """Run the action SESSION_ID waits to have approved (confirmation mode).

    Through the home's daemon when one runs; else here, following the session on.
    """
    act_on(session_id, home, script, lambda s: s.approve(action_id), timeout_s, verbose,
           check=_check_waiting)


@click.command()
@click.argument("session_id")
@click.argument("reason", required=False)
@click.option("--reason", "reason_option", metavar="REASON", hidden=True,
              help="The same as the REASON argument.")
@action_id_option
@script_option
@home_option
@timeout_option
@verbose_option
def reject(session_id: str, reason: str | None, reason_option: str | None, action_id: str,
           script: Path | None, home: Path | None, timeout_s: float, verbose: bool) -> None:
    """Do not run the action SESSION_ID waits to have approved: it is recorded rejected
    with REASON, which the agent reads, and the session carries on.

    Through the home's daemon when one runs; else here, following the session on.
    """
    if reason is not None and reason_option is not None:
        raise click.UsageError("give the reason once: as REASON or as --reason")
    why = reason if reason is not None else reason_option or ""
    act_on(session_id, home, script, lambda s: s.reject(why, action_id), timeout_s, verbose,
           check=_check_waiting)


def act_on(session_id: str, home: Path | None, script: Path | None, act: Act,
           timeout_s: float, verbose: bool,
           check: Callable[[Home, str], None] | None = None) -> None:
    """Carry out ``act`` on the session: through the home's daemon when one runs (it
    returns at once), else here, following the session on until it settles; ``check``
    refuses what cannot apply before any actor starts here."""
    trouper_home = open_home(home)
    choice = driving(trouper_home, daemon=None)
    if choice.daemon_url is not None:
        if script is not None:
            raise CliError(DAEMON_SCRIPT + " at the address the session knows", USAGE)
        with choice.open() as client:
            session = client.session(session_id)
            seq = act(session)
            click.echo(f"{session_id}: {session.info().state.value} (seq {seq})")
        return
    if check is not None:
        check(trouper_home, session_id)  # before any actor starts
    log_to_home(trouper_home, debug_enabled())
    files = read_files(home, Path.cwd())  # their timeout and [settings] apply, as resume's
    timeout_s = chosen(click.get_current_context(), files, "timeout")["timeout"].value
    code = carry_on(trouper_home, session_id, script, act, timeout_s=timeout_s,
                    verbose=verbose)
    click.get_current_context().exit(code)


def _check_waiting(home: Home, session_id: str) -> None:
    """Refuse (InvalidRequest, exit 2) a session with no action waiting for approval;
    UnknownSession for an id no session has."""
    from ..client.store_reader import StoreReader
    from ..exceptions import InvalidRequest

    with StoreReader(home) as reader:
        session = reader.session(session_id)
        if session.awaiting_confirmation is None:
            raise InvalidRequest(f"no action of session {session_id} waits for approval "
                                 f"(the session is {session.state.value})")


__all__ = ["act_on", "approve", "reject"]
