"""``trouper top``: the home's sessions as a live table, one row a session.

It reads as ``trouper sessions`` does (``cli_clients.reading``: the home's daemon when one
runs, else the store alone) and folds each session's log itself, with the very fold the
clients use (``core/fold.SessionView``: state, model calls, cost) plus what only a view of
many sessions shows: the last action, when the session entered its state, and how often
its sandbox was restarted. A refresh asks for the list, then only for the events appended
since the last refresh, of the sessions whose log grew: a second's refresh costs what
happened in that second, not every log again.

In a terminal the table is redrawn every ``--interval`` seconds (rich) until a signal;
``--once`` prints it once as plain aligned text, ``--json`` one JSON object per session
(once), for scripts. Everything shown is masked with the secrets of the sessions shown.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .clients import reading
from .console import console
from .support import OK, home_option, open_home

if TYPE_CHECKING:
    from rich.table import Table

    from ..client.info import SessionSummary
    from ..client.protocol import TrouperClient
    from ..core.fold import SessionView
    from ..home.paths import Home
    from ..messages.events import ActionEvent, Event

ACTION_CHARS = 60
"""A last action's summary is clipped to this many characters."""
HEADER = ("SESSION", "STATE", "STEP", "COST", "IN STATE", "RESTARTS", "LAST ACTION")


def _new_view() -> SessionView:
    from ..core.fold import SessionView

    return SessionView()


@dataclass
class Tracked:
    """What ``top`` knows of one session: its fold, and what the fold does not keep."""

    view: SessionView = field(default_factory=_new_view)
    last_action: ActionEvent | None = None
    state_since: datetime | None = None
    """When its latest ``StateChanged`` was appended; None before any."""
    restarts: int = 0
    """Its sandbox's restarts (``RuntimeEvent`` ``restarted``)."""

    def apply(self, event: Event) -> None:
        from ..messages.events import ActionEvent, RuntimeEvent, StateChanged

        self.view.apply(event)
        if isinstance(event, ActionEvent):
            self.last_action = event
        elif isinstance(event, StateChanged):
            self.state_since = event.ts
        elif isinstance(event, RuntimeEvent) and event.phase == "restarted":
            self.restarts += 1


@dataclass(frozen=True)
class Row:
    """One session as ``top`` shows it."""

    id: str
    state: str
    task: str
    iterations: int
    cost_usd: float
    state_since: datetime
    in_state_s: float
    restarts: int
    last_tool: str | None
    last_summary: str | None
    updated_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "task": self.task,
                "iterations": self.iterations, "cost_usd": self.cost_usd,
                "last_action": None if self.last_tool is None else {
                    "tool": self.last_tool, "summary": self.last_summary},
                "state_since": self.state_since.isoformat(),
                "in_state_s": round(self.in_state_s, 1), "restarts": self.restarts,
                "updated_at": self.updated_at.isoformat()}

    def cells(self) -> tuple[str, ...]:
        action = "" if self.last_tool is None else self.last_summary or self.last_tool
        return (self.id, self.state, str(self.iterations), f"${self.cost_usd:.4f}",
                duration(self.in_state_s), str(self.restarts), action)


class Top:
    """The sessions of one client, folded as their logs grow (``refresh``)."""

    def __init__(self, client: TrouperClient, home: Home) -> None:
        self.client, self.home = client, home
        self.tracked: dict[str, Tracked] = {}

    def refresh(self) -> list[Row]:
        """The rows now, newest session first."""
        from ..exceptions import UnknownSession
        from ..security.secrets_file import remember_session_secrets

        summaries = self.client.sessions()
        listed = {summary.id for summary in summaries}
        for gone in set(self.tracked) - listed:
            del self.tracked[gone]
        rows = []
        for summary in summaries:
            tracked = self.tracked.get(summary.id)
            if tracked is None:
                remember_session_secrets(self.home, summary.id)  # before any is shown
                tracked = self.tracked[summary.id] = Tracked()
            if summary.last_seq > tracked.view.last_seq:
                try:
                    for event in self.client.session(summary.id).events(tracked.view.last_seq):
                        tracked.apply(event)
                except UnknownSession:  # deleted since the list was read
                    continue
            rows.append(_row(summary, tracked, datetime.now(UTC)))
        return rows


def _row(summary: SessionSummary, tracked: Tracked, now: datetime) -> Row:
    from ..security.masking import mask_known
    from .render import describe_action

    since = tracked.state_since or summary.created_at
    action = tracked.last_action
    return Row(id=summary.id, state=summary.state.value, task=mask_known(summary.task),
               iterations=tracked.view.total_iterations, cost_usd=tracked.view.cost_usd,
               state_since=since, in_state_s=max(0.0, (now - since).total_seconds()),
               restarts=tracked.restarts,
               last_tool=None if action is None else mask_known(action.tool),
               last_summary=None if action is None else _clip(describe_action(action)),
               updated_at=summary.updated_at)


def _clip(text: str) -> str:
    line = " ".join(text.split())  # one line, whatever the command held
    return line if len(line) <= ACTION_CHARS else line[:ACTION_CHARS - 1] + "…"


def duration(seconds: float) -> str:
    """``42s``, ``3m04s``, ``2h05m``, ``3d04h``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def plain_table(rows: list[Row]) -> str:
    """The rows as aligned text columns under a header (the last column unpadded)."""
    lines = [HEADER, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False))
                     + "  " + line[-1] for line in lines)


def rich_table(rows: list[Row], source: str) -> Table:
    from rich.table import Table

    from ..messages.events import AgentState
    from .render import _STATE_STYLE  # the states' colours as events show them

    table = Table(title=f"trouper top: {len(rows)} session(s), {source}", title_justify="left",
                  box=None, header_style="bold", expand=False)
    for name in HEADER:
        table.add_column(name, no_wrap=name != "LAST ACTION",
                         justify="right" if name in ("STEP", "COST", "RESTARTS") else "left")
    for row in rows:
        style = _STATE_STYLE.get(AgentState(row.state), "cyan")
        cells = row.cells()
        table.add_row(cells[0], f"[{style}]{cells[1]}[/]", *[_escape(c) for c in cells[2:]])
    return table


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)  # a command's [brackets] are its text, not rich's style tags


@click.command()
@home_option
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print the table once, as plain text, and exit.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object per session, once, and exit.")
def top(home: Path | None, interval: float, once: bool, as_json: bool) -> None:
    """Show the sessions live: state, steps, cost, last action, time in state, restarts.

    Through the home's daemon when one runs, else from the store. Outside a terminal it
    prints the table once (as --once).
    """
    from ..client.store_reader import StoreReader

    trouper_home = open_home(home)
    with reading(trouper_home) as client:
        watch = Top(client, trouper_home)
        if as_json:
            for row in watch.refresh():
                click.echo(json.dumps(row.to_json()))
            return
        if once or not console.is_terminal:
            click.echo(plain_table(watch.refresh()))
            return
        source = "from the store" if isinstance(client, StoreReader) else "through the daemon"
        code = _live(watch, interval, source)
    click.get_current_context().exit(code)


def _live(watch: Top, interval: float, source: str) -> int:
    """Redraw every ``interval`` seconds until a signal; the signal's exit code."""
    from rich.live import Live

    from .console import make_console
    from .drive import Interrupts

    interrupts = Interrupts()  # (Live takes a Console itself, not the first-use stand-in)
    with interrupts.installed(), Live(rich_table(watch.refresh(), source),
                                      console=make_console(), auto_refresh=False) as live:
        while not interrupts.stop.wait(interval):
            live.update(rich_table(watch.refresh(), source), refresh=True)
    return OK if interrupts.signum == signal.SIGINT else interrupts.exit_code  # Ctrl-C: the end


__all__ = ["Row", "Top", "Tracked", "duration", "plain_table", "top"]
