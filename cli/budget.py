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

from .answer import act_on, script_option, timeout_option
from .support import home_option, verbose_option


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
    act_on(session_id, home, script, lambda s: s.budget(max_cost_usd, max_iterations),
           timeout_s, verbose)


__all__ = ["budget"]
