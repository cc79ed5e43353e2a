"""The CLI of the daemon: ``trouper daemon start|stop|status|logs|open|run``, and the
session commands that talk to it (``send``, ``pause``, ``stop``).

``register(main)`` adds them to the ``trouper`` group, with ``approve`` and ``reject``
(``cli_answer``: through the daemon when one runs, else in this process). The session
commands here need the daemon (exit 3 without one: ``cli_clients.daemon_client``);
``sessions``, ``events``, ``resume`` and ``run --daemon`` choose it themselves when it
runs (``cli_clients``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .answer import approve, reject
from .budget import budget
from .clients import daemon_client
from .support import ENVIRONMENT, OK, SESSION_FAILED, CliError, home_option, open_home

if TYPE_CHECKING:
    from ..client.protocol import TrouperClient


def _files(home: Path | None) -> Any:
    from ..daemon.files import DaemonFiles

    return DaemonFiles(open_home(home))


def _running(home: Path | None) -> dict[str, Any] | None:
    from ..daemon.files import running_info

    return running_info(_files(home))


# -- trouper daemon ... ---------------------------------------------------------------

PASSWORD_IN_ARGV = ("--store: a password on the command line is readable by every user of "
                    "this machine (ps); set TROUPER_STORE instead, or keep the password in "
                    "~/.pgpass (PGPASSFILE)")


def _store_given(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--store URL``: checked, then set as ``TROUPER_STORE`` for this process and the
    daemon it starts (its actors read it there, never on a command line)."""
    import os
    from urllib.parse import urlsplit

    if not value:
        return None
    source = ctx.get_parameter_source(param.name or "store")
    if source == click.core.ParameterSource.COMMANDLINE and urlsplit(value).password:
        raise click.BadParameter(PASSWORD_IN_ARGV.removeprefix("--store: "))
    os.environ["TROUPER_STORE"] = value
    return value


def cluster_options(command: Any) -> Any:
    """The options of a daemon on a shared store (docs/cluster.md)."""
    options = [
        click.option("--store", envvar="TROUPER_STORE", callback=_store_given,
                     expose_value=False, metavar="URL",
                     help="The event store: postgresql://user@host/db makes this daemon one "
                          "of the cluster on it (env TROUPER_STORE; default: the home's "
                          "SQLite file)."),
        click.option("--name", default=None,
                     help="This daemon's name in the cluster (default host:home-folder)."),
        click.option("--capability", "capabilities", multiple=True, metavar="NAME",
                     help="A capability to declare besides those found (local; docker "
                          "when its engine answers). Repeatable."),
        click.option("--label", "labels", multiple=True, metavar="NAME=VALUE",
                     help="A label a session may ask for (gpu=a100). Repeatable."),
        click.option("--heartbeat", "heartbeat_s", default=1.0, show_default=True,
                     type=click.FloatRange(0.05, 60.0),
                     help="Seconds between heartbeats; silent for 3 of them, a daemon is "
                          "declared dead and its sessions taken over."),
        click.option("--cluster-key", "key_file", default=None,
                     envvar="TROUPER_CLUSTER_KEY_FILE", metavar="FILE",
                     help="The cluster key (default <home>/cluster.key)."),
        click.option("--no-detect", "no_detect", is_flag=True, hidden=True),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _cluster(name: str | None, capabilities: tuple[str, ...], labels: tuple[str, ...],
             heartbeat_s: float, key_file: str | None, no_detect: bool) -> Any:
    from ..daemon.cluster_setup import ClusterOptions

    return ClusterOptions(name=name, capabilities=capabilities, labels=labels,
                          heartbeat_s=heartbeat_s, key_file=key_file, detect=not no_detect)


@click.group()
def daemon() -> None:
    """Run trouper as a local daemon: sessions outlive the terminal (docs/daemon.md)."""


@daemon.command()
@home_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback is reachable by others.")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: a free one, written to <home>/daemon.json).")
@cluster_options
def start(home: Path | None, host: str, port: int, **cluster: Any) -> None:
    """Start the daemon of the home; return once it answers. On a shared store
    (--store postgresql://...) it joins the cluster of daemons there."""
    from ..daemon.process import start as start_daemon
    from .support import debug_enabled

    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"trouper: warning: listening on {host}, not only on loopback: anyone "
                   "who reaches it and holds the token drives your sessions", err=True)
    info = start_daemon(open_home(home), host, port, debug=debug_enabled(),
                        cluster=_cluster(**cluster))
    click.echo(f"trouper daemon running at {info['url']} (pid {info['pid']}); "
               f"the web page: trouper daemon open")


@daemon.command(name="stop")
@home_option
@click.option("--timeout", "timeout_s", default=60.0, show_default=True)
def stop_daemon(home: Path | None, timeout_s: float) -> None:
    """Stop the daemon; its sessions stay resumable and carry on at the next start."""
    from ..daemon.process import stop

    info = stop(open_home(home), timeout_s)
    click.echo("no daemon was running" if info is None
               else f"trouper daemon (pid {info.get('pid')}) stopped")


@daemon.command()
@home_option
@click.option("--json", "as_json", is_flag=True, help="The daemon's info as JSON.")
def status(home: Path | None, as_json: bool) -> None:
    """Whether the daemon runs (exit 0) or not (exit 1), where, and its health."""
    from ..daemon.process import status as daemon_status

    info = daemon_status(open_home(home))
    if as_json:
        click.echo(json.dumps(info or {"running": False}))
    elif info is None:
        click.echo("trouper daemon: not running")
    else:
        health = info.get("health") or {}
        click.echo(f"trouper daemon: running at {info['url']} (pid {info['pid']}), "
                   f"{health.get('sessions', '?')} sessions, {health.get('streams', '?')} "
                   f"streams, up {health.get('uptime_s', 0):.0f} s")
        if info.get("cluster"):
            _print_cluster(info["cluster"], info.get("daemons") or [])
    click.get_current_context().exit(OK if info else SESSION_FAILED)


def _print_cluster(me: str, daemons: list[dict[str, Any]]) -> None:
    """The cluster's daemons, a line each: this one marked with ``*``."""
    click.echo(f"cluster of {len(daemons)} daemon(s); this one is {me}:")
    click.echo(f"  {'NAME':<20} {'STATE':<9} {'HEARTBEAT':>9} {'SESSIONS':>8}  "
               "CAPABILITIES  URL")
    for d in daemons:
        mark = "*" if d.get("name") == me else " "
        click.echo(f"{mark} {d.get('name', '?'):<20} {d.get('state', '?'):<9} "
                   f"{d.get('heartbeat_age_s', 0):>8.1f}s {d.get('sessions', 0):>8}  "
                   f"{','.join(d.get('capabilities', []))}  {d.get('url', '')}")


@daemon.command()
@home_option
@click.option("-n", "--lines", default=50, show_default=True, type=click.IntRange(0))
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
def logs(home: Path | None, lines: int, follow: bool) -> None:
    """Print the end of the daemon's log (<home>/logs/daemon.log)."""
    import time

    path = _files(home).log
    if not path.exists():
        raise CliError(f"no daemon log yet: {path}", ENVIRONMENT)
    with open(path, errors="replace") as log:
        for line in log.readlines()[-lines:] if lines else []:
            click.echo(line, nl=False)
        while follow:
            line = log.readline()
            if line:
                click.echo(line, nl=False)
            else:
                time.sleep(0.2)  # tail -f's poll


@daemon.command(name="open")
@home_option
def open_page(home: Path | None) -> None:
    """Print the web page's URL, the token in its fragment (browsers never send it)."""
    from ..daemon.files import read_token

    info = _running(home)
    if info is None:
        raise CliError("no daemon runs for this home: trouper daemon start", ENVIRONMENT)
    click.echo(f"{info['url']}/#token={read_token(_files(home))}")


@daemon.command(name="run")
@home_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535))
@click.option("--ready-fd", type=int, hidden=True)
@cluster_options
def run_foreground(home: Path | None, host: str, port: int, ready_fd: int | None,
                   **cluster: Any) -> None:
    """Run the daemon in the foreground (as 'start' does, detached); Ctrl-C stops it."""
    from ..daemon.server import log_to_stderr, ready_writer
    from ..daemon.server import run as serve
    from .support import debug_enabled, remove_cli_logging

    remove_cli_logging()
    log_to_stderr(debug_enabled())
    code = serve(open_home(home), host, port, ready_writer(ready_fd), _cluster(**cluster))
    click.get_current_context().exit(code)


# -- commands on a session in the daemon ------------------------------------------------


def _session_command(name: str, doc: str) -> click.Command:
    @click.command(name=name, help=doc)
    @click.argument("session_id")
    @home_option
    def command(session_id: str, home: Path | None) -> None:
        with daemon_client(open_home(home)) as client:
            seq = getattr(client.session(session_id), name)()
            _said(client, session_id, seq)
    return command


def _said(client: TrouperClient, session_id: str, seq: int) -> None:
    info = client.session(session_id).info()
    click.echo(f"{session_id}: {info.state.value} (seq {seq})")


@click.command()
@click.argument("session_id")
@click.argument("text")
@home_option
def send(session_id: str, text: str, home: Path | None) -> None:
    """Give the agent of a session in the daemon a message."""
    with daemon_client(open_home(home)) as client:
        _said(client, session_id, client.session(session_id).send(text))


def register(main: click.Group) -> None:
    """Add the daemon's commands to ``main``."""
    main.add_command(daemon)
    main.add_command(send)
    main.add_command(approve)
    main.add_command(reject)
    main.add_command(budget)
    main.add_command(_session_command("pause", "Pause a session in the daemon."))
    main.add_command(_session_command("stop", "Stop a session in the daemon."))


__all__ = ["daemon", "register"]
