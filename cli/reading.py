"""``trouper sessions`` and ``trouper events``: the commands that only read.

Each reads through ``cli_clients.reading``: the home's daemon when one runs, else the
store alone (no actor system, no litellm, no log written). Either way it makes the same
calls and prints the same lines. What they print is masked with the secrets of the
sessions shown (read from the home), whichever client brought it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..security.secrets_file import remember_session_secrets
from .clients import reading
from .drive import Interrupts, console
from .support import OK, home_option, open_home, verbose_option

if TYPE_CHECKING:
    from ..client.protocol import SessionHandle
    from ..home.paths import Home
    from ..messages.events import Event


@click.command()
@home_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--state", help="Only the sessions in this state.")
@click.option("--all", "every", is_flag=True,
              help="Also the sessions a rewind replaced (each says by which).")
def sessions(home: Path | None, as_json: bool, state: str | None, every: bool) -> None:
    """List the sessions in the store, newest first.

    Through the home's daemon when one runs. A session a rewind replaced is left out,
    but with --all.
    """
    from ..daemon.service import mask
    from ..security.masking import mask_known

    wanted = _state(state)
    trouper_home = open_home(home)
    with reading(trouper_home) as client:
        for summary in client.sessions(state=wanted, replaced=every):
            remember_session_secrets(trouper_home, summary.id)
            if as_json:
                click.echo(json.dumps(mask(summary.to_json())))
            else:
                # markup off: a task's [brackets] are its text, not rich's style tags
                console.print(f"{summary.id}  {summary.state.value:<22} "
                              f"{summary.updated_at:%Y-%m-%d %H:%M:%S}  "
                              f"{mask_known(summary.task)[:60]}"
                              + (f"  (replaced by {summary.replaced_by})"
                                 if summary.replaced_by else ""), markup=False)


def _state(state: str | None) -> str | None:
    from ..messages.events import AgentState

    if state is None:
        return None
    try:
        return AgentState(state.lower()).value
    except ValueError:
        known = ", ".join(s.value for s in AgentState)
        raise click.BadParameter(f"{state!r}; one of {known}", param_hint="--state") from None


@click.command()
@click.argument("session_id")
@home_option
@click.option("--since", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new events until the session settles.")
@verbose_option
def events(session_id: str, home: Path | None, since: int, as_json: bool, follow: bool,
           verbose: bool) -> None:
    """Print a session's events from the store.

    Through the home's daemon when one runs. With --follow, new events as whoever drives
    the session appends them, until it settles; a signal ends it (exit 130, 143, 129).
    A session that settles waiting for approval ends it with the command that answers.
    """
    from ..client.store_reader import StoreReader

    trouper_home = open_home(home)
    with reading(trouper_home) as client:
        session = client.session(session_id)  # unknown: an error before anything is printed
        remember_session_secrets(trouper_home, session_id)
        if not follow:
            for event in session.events(since):
                _show(event, as_json, verbose)
            return
        interrupts = Interrupts()
        with interrupts.installed():
            for event in session.events(since, follow=True, stop=interrupts.stop):
                _show(event, as_json, verbose)
        if not interrupts.signum:
            _say_if_waiting(session, trouper_home, in_daemon=not isinstance(
                client, StoreReader))
    click.get_current_context().exit(interrupts.exit_code if interrupts.signum else OK)


def _say_if_waiting(session: SessionHandle, home: Home, in_daemon: bool) -> None:
    """On stderr, when the session settled waiting for approval: how to answer it."""
    from .next_steps import carry_on_flags, how_to_go_on
    from .scripted import SCRIPTED_MODEL

    info = session.info()
    if info.awaiting_confirmation is None:
        return
    scripted = not in_daemon and info.config.llm.model == SCRIPTED_MODEL
    flags = carry_on_flags(home, "FILE" if scripted else None)
    click.echo(f"trouper: session {info.id} {how_to_go_on(info.id, info.state, flags, info.cause)}",
               err=True)


def _show(event: Event, as_json: bool, verbose: bool) -> None:
    from ..security.masking import known_masker
    from .render import render

    if as_json:
        click.echo(known_masker().mask_event(event).model_dump_json())
    elif (line := render(event, verbose=verbose)) is not None:
        console.print(line)


__all__ = ["events", "sessions"]
