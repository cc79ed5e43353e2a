"""What ``sessions``, ``events``, ``resume`` and ``run --daemon`` do through the daemon
(``cli_daemon`` routes them here), and the store-reading parts they gained.

Following a session in the daemon reuses ``cli_session.stream``: a ``RemoteSession`` has
``Session``'s ``events(since, follow=True, ...)``. Ctrl-C while following detaches: the
session goes on in the daemon (exit 130, as every interrupted command).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from .cli_session import console, stream
from .cli_support import INTERRUPTED_BASE, OK, SESSION_FAILED, USAGE, CliError, open_home

DETACHED = ("detached: session {id} goes on in the daemon; follow it again with "
            "'trouper events {id} --follow'")


@contextmanager
def ctrl_c_interrupts() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt inside the block even where this process was started
    with SIGINT ignored (a ``cmd &`` shell does that, and Python then never installs its
    handler): following a session always detaches on Ctrl-C, as ``trouper run`` pauses."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _print_summary_line(summary: dict[str, Any]) -> None:
    console.print(f"{summary['id']}  {summary['state']:<22} "
                  f"{summary['updated_at'][:19].replace('T', ' ')}  {summary['task'][:60]}")


# -- sessions ----------------------------------------------------------------------------


def sessions_remote(client: Any, *, as_json: bool, state: str | None, **_: Any) -> int:
    for summary in client.sessions(state=_state(state)):
        if as_json:
            click.echo(json.dumps(summary))
        else:
            _print_summary_line(summary)
    return OK


def sessions_local(home: Path | None, as_json: bool, state: str | None, **_: Any) -> Any:
    """``--json`` and ``--state`` read from the store; the plain listing stays cli.py's."""
    if not as_json and state is None:
        return NotImplemented
    from .daemon.service import record_summary
    from .messages.events import AgentState
    from .session_secrets import remember_session_secrets
    from .store import open_store

    wanted = _state(state)
    trouper_home = open_home(home)
    store = open_store(trouper_home)
    try:
        for record in store.sessions():
            if wanted is not None and record.state != AgentState(wanted):
                continue
            remember_session_secrets(trouper_home, record.session_id)
            summary = record_summary(record)
            click.echo(json.dumps(summary)) if as_json else _print_summary_line(summary)
    finally:
        store.close()
    return OK


def _state(state: str | None) -> str | None:
    from .messages.events import AgentState

    if state is None:
        return None
    try:
        return AgentState(state.lower()).value
    except ValueError:
        known = ", ".join(s.value for s in AgentState)
        raise click.BadParameter(f"{state!r}; one of {known}", param_hint="--state") from None


# -- events ----------------------------------------------------------------------------


def _show(event: Any, as_json: bool, verbose: bool) -> None:
    from .masking import known_masker
    from .render import render

    if as_json:
        click.echo(known_masker().mask_event(event).model_dump_json())
    elif (line := render(event, verbose=verbose)) is not None:
        console.print(line)


def events_remote(client: Any, *, session_id: str, since: int, as_json: bool, verbose: bool,
                  follow: bool, **_: Any) -> int:
    session = client.session(session_id)
    try:
        with ctrl_c_interrupts():
            for event in session.events(since, follow=follow):
                _show(event, as_json, verbose)
    except KeyboardInterrupt:
        return INTERRUPTED_BASE + 2
    return OK


def events_local(*, session_id: str, home: Path | None, since: int, as_json: bool,
                 verbose: bool, follow: bool) -> Any:
    """``--follow`` without a daemon: the store's events as whoever drives the session
    appends them, until it settles."""
    if not follow:
        return NotImplemented
    from .fold import SessionView
    from .session_secrets import remember_session_secrets
    from .store import open_store

    trouper_home = open_home(home)
    store = open_store(trouper_home)
    try:
        store.session(session_id)
        remember_session_secrets(trouper_home, session_id)
        view = SessionView.of(store.read(session_id, limit=since)) if since else SessionView()
        if view.settled and view.last_seq >= store.last_seq(session_id):
            return OK
        with ctrl_c_interrupts():
            for event in store.follow(session_id, since=since):
                view.apply(event)
                _show(event, as_json, verbose)
                if view.settled and view.last_seq >= store.last_seq(session_id):
                    break
    except KeyboardInterrupt:
        return INTERRUPTED_BASE + 2
    finally:
        store.close()
    return OK


# -- resume and run --daemon -----------------------------------------------------------------


def follow_remote(session: Any, since: int, timeout_s: float, verbose: bool) -> int:
    """Stream a daemon's session until it settles or ``timeout_s``; a summary; the code.
    Ctrl-C detaches (the session goes on)."""
    try:
        with ctrl_c_interrupts():
            stream(session, timeout_s, verbose, since=since)
    except KeyboardInterrupt:
        click.echo(DETACHED.format(id=session.id), err=True)
        return INTERRUPTED_BASE + 2
    info = session.info()
    rows = [("state", info["state"])]
    if info["state"] != "finished" and info.get("reason"):
        rows.append(("reason", info["reason"]))
    rows += [("steps", f"{info['iterations']} model calls, {info['actions']} actions")]
    if info.get("cost_usd"):
        rows.append(("cost", f"${info['cost_usd']:.4f}"))
    rows += [("workspace", info["workspace"]), ("session", info["id"])]
    if not info["settled"]:
        rows.append(("follow", f"trouper events {info['id']} --follow"))
    for key, value in rows:
        console.print(f"[dim]{key:<10}[/dim] {value}")
    return OK if info["state"] == "finished" else SESSION_FAILED


def resume_remote(client: Any, *, session_id: str, message: str | None, script: Path | None,
                  timeout_s: float, verbose: bool, **_: Any) -> int:
    if script is not None:
        raise CliError("--script serves the model from this process, and the session runs "
                       "in the daemon: serve it with 'trouper fake-llm --script FILE --port N' "
                       "at the address the session knows", USAGE)
    session = client.session(session_id)
    before = int(session.info()["last_seq"])
    session.send(message) if message else session.resume()
    return follow_remote(session, before, timeout_s, verbose)


def run_remote(client: Any, *, task: str | None, model: str | None, base_url: str | None,
               api_key: str | None, runtime: str, workspace: Path | None,
               script: Path | None, max_iterations: int, timeout_s: float, verbose: bool,
               **more: Any) -> int:
    from .config_check import OPTIONS

    if task is None:
        raise click.UsageError("--daemon needs a TASK (the demo runs in this process: "
                               "'trouper demo')")
    if script is not None:
        raise click.UsageError("--script serves the model from this process, which the "
                               "daemon's session outlives: serve it with 'trouper fake-llm "
                               "--script FILE --port N' and give --base-url")
    if not model:
        raise click.UsageError("no model: give --model MODEL (or set TROUPER_MODEL)")
    llm: dict[str, Any] = {"model": model, "base_url": base_url}
    if api_key:
        llm["api_key"] = api_key
    options = {k: v for k, v in more.items() if k in OPTIONS and v is not None}
    session = client.start_session(
        task, llm=llm, runtime=runtime, max_iterations=max_iterations,
        workspace=str(workspace.expanduser().resolve()) if workspace else None, **options)
    console.print(f"[dim]running in the daemon at {client.url}; Ctrl-C detaches[/dim]")
    return follow_remote(session, 0, timeout_s, verbose)


__all__ = ["events_local", "events_remote", "follow_remote", "resume_remote", "run_remote",
           "sessions_local", "sessions_remote"]
