"""The CLI of the daemon: ``trouper daemon start|stop|status|logs|open|run``, the session
commands that talk to it (``send``, ``pause``, ``stop``, ``approve``, ``reject``), and
the daemon's side of ``sessions``, ``events``, ``resume`` and ``run --daemon``.

``register(main, ...)`` adds them to the ``trouper`` group. ``sessions``, ``events``,
``resume`` and ``run`` keep their own behaviour when no daemon runs for the home (they
read the store, or run an actor system in this process); when one runs they go through
it, so two actor systems never drive one session. Commands that only make sense with a
running session (``send``, ``pause``...) need the daemon (exit 3 without one).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .cli_support import ENVIRONMENT, INTERRUPTED_BASE, OK, SESSION_FAILED, CliError, open_home
from .paths import HOME_ENV

home_option = click.option(
    "--home", type=click.Path(file_okay=False, path_type=Path), envvar=HOME_ENV,
    help=f"trouper home (env {HOME_ENV}, default ~/.trouper).")


def _files(home: Path | None) -> Any:
    from .daemon.files import DaemonFiles

    return DaemonFiles(open_home(home))


def _running(home: Path | None) -> dict[str, Any] | None:
    from .daemon.files import running_info

    return running_info(_files(home))


def _client(home: Path | None, required: bool = True) -> Any:
    """A client of the home's daemon; None (or exit 3 when ``required``) if none runs."""
    from .daemon.client import connect

    if _running(home) is None:
        if not required:
            return None
        where = open_home(home).root
        raise CliError(f"no daemon runs for {where}: start one with 'trouper daemon start"
                       f"{' --home ' + str(where) if home else ''}'", ENVIRONMENT)
    return connect(home=open_home(home).root)


# -- trouper daemon ... ---------------------------------------------------------------


@click.group()
def daemon() -> None:
    """Run trouper as a local daemon: sessions outlive the terminal (docs/daemon.md)."""


@daemon.command()
@home_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback is reachable by others.")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: a free one, written to <home>/daemon.json).")
def start(home: Path | None, host: str, port: int) -> None:
    """Start the daemon of the home; return once it answers."""
    from .cli_support import debug_enabled
    from .daemon.process import start as start_daemon

    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"trouper: warning: listening on {host}, not only on loopback: anyone "
                   "who reaches it and holds the token drives your sessions", err=True)
    info = start_daemon(open_home(home), host, port, debug=debug_enabled())
    click.echo(f"trouper daemon running at {info['url']} (pid {info['pid']}); "
               f"the web page: trouper daemon open")


@daemon.command(name="stop")
@home_option
@click.option("--timeout", "timeout_s", default=60.0, show_default=True)
def stop_daemon(home: Path | None, timeout_s: float) -> None:
    """Stop the daemon; its sessions stay resumable and carry on at the next start."""
    from .daemon.process import stop

    info = stop(open_home(home), timeout_s)
    click.echo("no daemon was running" if info is None
               else f"trouper daemon (pid {info.get('pid')}) stopped")


@daemon.command()
@home_option
@click.option("--json", "as_json", is_flag=True, help="The daemon's info as JSON.")
def status(home: Path | None, as_json: bool) -> None:
    """Whether the daemon runs (exit 0) or not (exit 1), where, and its health."""
    from .daemon.process import status as daemon_status

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
    click.get_current_context().exit(OK if info else SESSION_FAILED)


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
    from .daemon.files import read_token

    info = _running(home)
    if info is None:
        raise CliError("no daemon runs for this home: trouper daemon start", ENVIRONMENT)
    click.echo(f"{info['url']}/#token={read_token(_files(home))}")


@daemon.command(name="run")
@home_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535))
@click.option("--ready-fd", type=int, hidden=True)
def run_foreground(home: Path | None, host: str, port: int, ready_fd: int | None) -> None:
    """Run the daemon in the foreground (as 'start' does, detached); Ctrl-C stops it."""
    from .cli_support import debug_enabled, remove_cli_logging
    from .daemon.server import log_to_stderr, ready_writer
    from .daemon.server import run as serve

    remove_cli_logging()
    log_to_stderr(debug_enabled())
    code = serve(open_home(home), host, port, ready_writer(ready_fd))
    click.get_current_context().exit(code)


# -- commands on a session in the daemon ------------------------------------------------


def _session_command(name: str, doc: str) -> click.Command:
    @click.command(name=name, help=doc)
    @click.argument("session_id")
    @home_option
    def command(session_id: str, home: Path | None) -> None:
        with _client(home) as client:
            seq = getattr(client.session(session_id), name)()
            _said(client, session_id, seq)
    return command


def _said(client: Any, session_id: str, seq: int) -> None:
    info = client.session(session_id).info()
    click.echo(f"{session_id}: {info['state']} (seq {seq})")


@click.command()
@click.argument("session_id")
@click.argument("text")
@home_option
def send(session_id: str, text: str, home: Path | None) -> None:
    """Give the agent of a session in the daemon a message."""
    with _client(home) as client:
        _said(client, session_id, client.session(session_id).send(text))


@click.command()
@click.argument("session_id")
@click.option("--action-id", default="", help="Only if this is the action waiting.")
@home_option
def approve(session_id: str, action_id: str, home: Path | None) -> None:
    """Run the action a session waits to have approved (confirmation mode)."""
    with _client(home) as client:
        _said(client, session_id, client.session(session_id).approve(action_id))


@click.command()
@click.argument("session_id")
@click.option("--reason", default="", help="Why: the agent reads it.")
@click.option("--action-id", default="", help="Only if this is the action waiting.")
@home_option
def reject(session_id: str, reason: str, action_id: str, home: Path | None) -> None:
    """Do not run the action waiting: it is recorded rejected, the agent carries on."""
    with _client(home) as client:
        _said(client, session_id, client.session(session_id).reject(reason, action_id))


# -- sessions, events, resume and run: through the daemon when one runs ---------------------


def _extended(old: click.Command, extra: list[click.Parameter],
              through_daemon: Callable[..., int | None],
              without_daemon: Callable[..., Any] | None = None,
              daemon_flag: str | None = None) -> click.Command:
    """``old`` with ``extra`` options. Through the daemon when one runs for the home (with
    ``daemon_flag``: only when that option is given, and then the daemon is started if
    none runs); else ``without_daemon``, and ``old`` (without the extras) when that is
    missing or returns NotImplemented."""
    names = {p.name for p in extra}

    @functools.wraps(old.callback)  # type: ignore[arg-type]
    def callback(**kwargs: Any) -> Any:
        ctx = click.get_current_context()
        home = kwargs.get("home")
        if daemon_flag is None:
            client = _client(home, required=False)
        else:
            client = _started_client(home) if kwargs.get(daemon_flag) else None
        if client is not None:
            with client:
                code = through_daemon(client, **kwargs)
        else:
            code = without_daemon(**kwargs) if without_daemon is not None else NotImplemented
            if code is NotImplemented:
                code = ctx.invoke(old.callback,  # type: ignore[arg-type]
                                  **{k: v for k, v in kwargs.items() if k not in names})
        if isinstance(code, int):
            ctx.exit(code)

    through = ("With --daemon, in the home's daemon." if daemon_flag else
               "Through the home's daemon when one runs.")
    return click.Command(old.name, callback=callback, params=[*old.params, *extra],
                         help=f"{old.help or ''}\n\n{through}", short_help=old.short_help,
                         epilog=old.epilog)


def _started_client(home: Path | None) -> Any:
    """A client of the home's daemon, started first if none runs."""
    from .cli_support import debug_enabled
    from .daemon.process import start as start_daemon

    if _running(home) is None:
        info = start_daemon(open_home(home), debug=debug_enabled())
        click.echo(f"trouper: started the daemon at {info['url']} (pid {info['pid']})",
                   err=True)
    return _client(home)


def register(main: click.Group, *, run: click.Command, sessions: click.Command,
             events: click.Command, resume: click.Command) -> None:
    """Add the daemon's commands to ``main``; extend ``run``, ``sessions``, ``events`` and
    ``resume`` so they go through the daemon when one runs (see the module docstring)."""
    from . import cli_remote

    main.add_command(daemon)
    main.add_command(send)
    main.add_command(approve)
    main.add_command(reject)
    main.add_command(_session_command("pause", "Pause a session in the daemon."))
    main.add_command(_session_command("stop", "Stop a session in the daemon."))
    main.add_command(_extended(sessions, [
        click.Option(["--json", "as_json"], is_flag=True, help="One JSON object per line."),
        click.Option(["--state"], help="Only the sessions in this state.")],
        cli_remote.sessions_remote, cli_remote.sessions_local))
    main.add_command(_extended(events, [
        click.Option(["--follow", "-f"], is_flag=True,
                     help="Keep printing new events until the session settles.")],
        cli_remote.events_remote, cli_remote.events_local))
    main.add_command(_extended(resume, [], cli_remote.resume_remote))
    main.add_command(_extended(run, [
        click.Option(["--daemon"], is_flag=True,
                     help="Run the session in the home's daemon (started if none runs) and "
                          "follow it; Ctrl-C detaches, the session goes on.")],
        cli_remote.run_remote, daemon_flag="daemon"))


__all__ = ["INTERRUPTED_BASE", "daemon", "register"]
