"""``trouper budget ID --max-cost-usd X --max-iterations N``: set a session's budget,
with or without a daemon.

A session paused because a budget ran out (``on_budget = "ask"``) carries on if the new
one lasts; one that would still be spent is refused (exit 2) and nothing changes. While
the home's daemon runs, the command goes to it and returns at once; without one, it opens
the home here and follows the session until it settles, as ``resume`` does.
"""

from __future__ import annotations

from pathlib import Path

import click

from .answer import script_option, timeout_option
from .carry_on import DAEMON_SCRIPT, carry_on
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


@click.command()
@click.argument("session_id")
@click.option("--max-cost-usd", type=click.FloatRange(min=0, min_open=True),
              help="The most the session may spend, in USD, over its whole log.")
@click.option("--max-iterations", type=click.IntRange(min=1),
              help="Model calls allowed since the user's last message or resume.")
@script_option
@home_option
@timeout_option
@verbose_option
def budget(session_id: str, max_cost_usd: float | None, max_iterations: int | None,
           script: Path | None, home: Path | None, timeout_s: float, verbose: bool) -> None:
    """Set the budget of SESSION_ID from now on; a session paused for a spent budget
    carries on."""
    if max_cost_usd is None and max_iterations is None:
        raise click.UsageError("give --max-cost-usd, --max-iterations or both")
    trouper_home = open_home(home)
    choice = driving(trouper_home, daemon=None)
    if choice.daemon_url is not None:
        if script is not None:
            raise CliError(DAEMON_SCRIPT + " at the address the session knows", USAGE)
        with choice.open() as client:
            session = client.session(session_id)
            seq = session.budget(max_cost_usd, max_iterations)
            info = session.info()
            click.echo(f"{session_id}: {info.state.value} (seq {seq})")
        return
    log_to_home(trouper_home, debug_enabled())
    files = read_files(home, Path.cwd())
    timeout_s = chosen(click.get_current_context(), files, "timeout")["timeout"].value
    code = carry_on(trouper_home, session_id, script,
                    lambda s: s.budget(max_cost_usd, max_iterations), timeout_s=timeout_s,
                    verbose=verbose)
    click.get_current_context().exit(code)


__all__ = ["budget"]
