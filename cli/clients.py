"""Which client a command talks to, chosen once: the home's daemon, or this process.

    reading(home)              sessions, events: the daemon's client when one runs for the
                               home, else a ``StoreReader`` (the store alone: no actor
                               system, no litellm)
    driving(home, daemon=...)  run, demo, resume: the daemon's client (None: when one runs;
                               True: started if none runs), else an embedded ``Trouper``
    daemon_client(home)        send, pause, stop, approve, reject: the daemon's (exit 3
                               when none runs)

Each returns a ``TrouperClient``, or a ``Choice`` that opens one, and the command then
calls the same methods whichever it got. ``Choice.daemon_url`` says only where the
session lives on once the command ends: in the daemon, or nowhere until it is resumed.
So a session never has two actor systems: while a daemon runs, ``resume`` goes through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .support import ENVIRONMENT, CliError, debug_enabled

if TYPE_CHECKING:
    from ..client.protocol import TrouperClient
    from ..home.paths import Home


@dataclass(frozen=True)
class Choice:
    """The client a command will use, opened when it is needed (after what must come
    first: a scripted server listening before any actor starts)."""

    open: Callable[[], TrouperClient]
    daemon_url: str | None = None
    """The daemon the command goes through; None: an embedded ``Trouper`` in this process,
    whose sessions stop working when the command ends."""
    opening: str = "starting the actor system…"
    """What the command shows while ``open`` runs."""


def reading(home: Home) -> TrouperClient:
    """A client to read the home's sessions: its daemon's, else its store's."""
    from ..client.store_reader import StoreReader

    url = _running_url(home)
    return _connect(home) if url is not None else StoreReader(home)


def driving(home: Home, *, daemon: bool | None) -> Choice:
    """The client that runs a command's session: the home's daemon (``daemon=None``: if
    one runs; ``True``: started first if none runs), else an embedded ``Trouper``."""
    url = _running_url(home) if daemon is not False else None
    if daemon and url is None:
        url = _start_daemon(home)
    if url is not None:
        return Choice(lambda: _connect(home), url, "connecting to the daemon…")
    return Choice(lambda: _embedded(home))


def daemon_client(home: Home) -> TrouperClient:
    """The client of the home's daemon; exit 3 (saying how to start one) if none runs."""
    if _running_url(home) is None:
        usual = (Path.home() / ".trouper").resolve()
        where = "" if home.root == usual else f" --home {home.root}"
        raise CliError(f"no daemon runs for {home.root}: start one with 'trouper daemon "
                       f"start{where}'", ENVIRONMENT)
    return _connect(home)


def _running_url(home: Home) -> str | None:
    from ..daemon.files import DaemonFiles, running_info

    info = running_info(DaemonFiles(home))
    return None if info is None else str(info["url"])


def _connect(home: Home) -> Any:
    from ..client.daemon import connect

    return connect(home=home.root)


def _start_daemon(home: Home) -> str:
    from ..daemon.process import start

    info = start(home, debug=debug_enabled())
    click.echo(f"trouper: started the daemon at {info['url']} (pid {info['pid']})", err=True)
    return str(info["url"])


def _embedded(home: Home) -> Any:
    from ..client.embedded import (
        Trouper,  # the actor system and litellm: only for the commands that run
    )

    return Trouper(home=home.root, resume=False)


__all__ = ["Choice", "daemon_client", "driving", "reading"]
