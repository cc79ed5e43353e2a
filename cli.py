"""The ``trouper`` command line."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from .cli_support import (
    DEBUG_ENV,
    ENVIRONMENT,
    CliError,
    TrouperGroup,
    debug_enabled,
    log_to_home,
    open_home,
    os_message,
)
from .paths import HOME_ENV, Home

MODEL_ENV = "TROUPER_MODEL"
BASE_URL_ENV = "TROUPER_BASE_URL"
DEMO_TASK = "Write a small Python program with a test, run it, then improve it."
DEMO_MODEL = "hosted_vllm/trouper-demo"
DEMO_SCRIPT = Path(__file__).parent / "testing" / "demo_script.json"
SCRIPTED_MODEL = "hosted_vllm/scripted"
"""The model name of a ``--script`` run without ``--model``."""
SCRIPTED_KEY = "trouper-fake-llm-key"
"""The scripted server's API key. Every key is masked wherever it appears, so it must be
a word no model name or output holds (``scripted`` turned the model name into
``hosted_vllm/<secret:LLM_API_KEY>``)."""
NO_MODEL = (f"no model: give --model MODEL (or set {MODEL_ENV}), or --script FILE for a "
            "scripted one; to watch the built-in demo, run 'trouper demo' (or 'trouper run' "
            "with no task)")
DEMO_NO_WORKSPACE = ("the demo works in a fresh folder under the trouper home, never in a "
                     "folder you name: drop --workspace (or give a TASK and --model)")

console = Console(highlight=False)


@click.group(cls=TrouperGroup)
@click.version_option(package_name="trouper")
@click.option("--debug", is_flag=True, envvar=DEBUG_ENV,
              help=f"Print tracebacks with errors; log at DEBUG (env {DEBUG_ENV}=1).")
def main(debug: bool) -> None:
    """trouper: run LLM coding-agent sessions as supervised actors.

    Exit codes: 0 finished, 1 the session ended otherwise, 2 usage or configuration,
    3 environment, 4 unexpected. See cli_support.py.
    """


@main.command()
@click.argument("task", required=False)
@click.option("--model", envvar=MODEL_ENV,
              help=f"litellm model, e.g. openai/gpt-4o (env {MODEL_ENV}); needed unless "
                   "--script.")
@click.option("--base-url", envvar=BASE_URL_ENV, help="API base of the model's server.")
@click.option("--api-key", help="API key; default: the provider's usual env var.")
@click.option("--runtime", default="local", show_default=True, type=click.Choice(["local"]))
@click.option("--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Folder the agent works in (default: a new folder under the home).")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), envvar=HOME_ENV,
              help=f"trouper home (env {HOME_ENV}, default ~/.trouper).")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Answer with a scripted LLM server (a JSON script) instead of a model.")
@click.option("--max-iterations", default=50, show_default=True, type=click.IntRange(1))
@click.option("--timeout", "timeout_s", default=3600.0, show_default=True,
              help="Give up waiting after this many seconds.")
@click.option("-v", "--verbose", is_flag=True, help="Show thoughts, token counts, full output.")
def run(task: str | None, model: str | None, base_url: str | None, api_key: str | None,
        runtime: str, workspace: Path | None, home: Path | None, script: Path | None,
        max_iterations: int, timeout_s: float, verbose: bool) -> None:
    """Run one session on TASK and stream it; exit 0 when it FINISHED.

    With no TASK and no model, runs the built-in demo (as 'trouper demo').
    """
    if task is None and not model and not script:
        if workspace is not None:
            raise click.UsageError(DEMO_NO_WORKSPACE)
        _demo(home, timeout_s, verbose)
        return
    if task is None:
        raise click.UsageError("give a TASK (or run 'trouper demo' for the built-in demo)")
    if not model and not script:
        raise click.UsageError(NO_MODEL)
    with _llm_for(model, base_url, api_key, script) as llm:
        _run_session(home, task, llm, timeout_s, verbose, runtime=runtime,
                     workspace=workspace, max_iterations=max_iterations)


@main.command()
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), envvar=HOME_ENV,
              help=f"trouper home (env {HOME_ENV}, default ~/.trouper).")
@click.option("--workspace", hidden=True, help="Refused: the demo never uses your folders.")
@click.option("--timeout", "timeout_s", default=3600.0, show_default=True,
              help="Give up waiting after this many seconds.")
@click.option("-v", "--verbose", is_flag=True, help="Show thoughts, token counts, full output.")
def demo(home: Path | None, workspace: str | None, timeout_s: float, verbose: bool) -> None:
    """Run the built-in demo in a fresh folder under the home (no key, no network).

    A scripted model on loopback has the agent write, run, test and improve a small
    program. It never works in a folder you name: --workspace is refused.
    """
    if workspace is not None:
        raise click.UsageError(DEMO_NO_WORKSPACE)
    _demo(home, timeout_s, verbose)


def _demo(home: Path | None, timeout_s: float, verbose: bool) -> None:
    console.print("[dim]the built-in demo: a scripted LLM server on loopback plays the "
                  "model (give a TASK and --model for a real one)[/dim]")
    with _llm_for(DEMO_MODEL, None, None, DEMO_SCRIPT) as llm:
        _run_session(home, DEMO_TASK, llm, timeout_s, verbose)  # the default workspace


def _run_session(home: Path | None, task: str, llm: dict[str, Any], timeout_s: float,
                 verbose: bool, **options: Any) -> None:
    from .api import Trouper
    from .masking import mask_known
    from .messages.events import AgentState

    trouper_home = _home_with_log(home)
    with console.status("starting the actor system…"), contextlib.ExitStack() as stack:
        trouper = stack.enter_context(Trouper(home=trouper_home.root, resume=False))
        session = trouper.start_session(task, llm=llm, **options)
        stack.pop_all()
    try:
        state = _stream(session, timeout_s, verbose)
    except KeyboardInterrupt:
        session.stop()
        state = session.wait(timeout=10)
    finally:
        record = session.record
        with console.status("stopping…"):
            trouper.close()
    console.print(f"workspace: {record.config.workspace}")
    if state != AgentState.FINISHED:
        console.print(f"[red]session {session.id} ended {state.value}: "
                      f"{mask_known(record.state_reason)}[/red]")
        sys.exit(1)


@main.command()
@click.argument("session_id")
@click.option("--message", "-m", help="Send this message to the agent instead of resuming.")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), envvar=HOME_ENV)
@click.option("--timeout", "timeout_s", default=3600.0, show_default=True)
@click.option("-v", "--verbose", is_flag=True)
def resume(session_id: str, message: str | None, home: Path | None, timeout_s: float,
           verbose: bool) -> None:
    """Carry on a stored session (or give it a message) and stream it until it settles."""
    from .api import Trouper, remember_session_secrets
    from .masking import mask_known
    from .messages.events import AgentState
    from .store import open_store

    trouper_home = _home_with_log(home)
    store = open_store(trouper_home)
    try:
        store.session(session_id)  # an unknown id is an error before any actor starts
    finally:
        store.close()
    with Trouper(home=trouper_home.root, resume=False) as trouper:
        remember_session_secrets(trouper.home, session_id)  # shown output is masked
        session = trouper.session(session_id)
        before = session.record.last_seq
        if message:
            session.send(message)
        else:
            session.resume()
        state = _stream(session, timeout_s, verbose, since=before)
        record = session.record
    if state != AgentState.FINISHED:
        console.print(f"[red]session {session_id} is {state.value}: "
                      f"{mask_known(record.state_reason)}[/red]")
        sys.exit(1)


def _home_with_log(home: Path | None) -> Home:
    trouper_home = open_home(home)
    log_to_home(trouper_home, debug_enabled())
    return trouper_home


def _stream(session: Any, timeout_s: float, verbose: bool, since: int = 0) -> Any:
    from .messages.events import ActionEvent, ObservationEvent
    from .render import describe_action, render

    console.print(f"[bold]session {session.id}[/bold]")
    status = console.status("waiting for the model…")
    status.start()
    try:
        for event in session.events(since, follow=True, timeout_s=timeout_s):
            line = render(event, verbose=verbose)
            if line is not None:
                status.stop()
                console.print(line)
                status.start()
            if isinstance(event, ActionEvent):
                status.update(f"running {describe_action(event)[:60]}…")
            elif isinstance(event, ObservationEvent):
                status.update("waiting for the model…")
    finally:
        status.stop()
    return session.wait(timeout=0)


@contextlib.contextmanager
def _llm_for(model: str | None, base_url: str | None, api_key: str | None,
             script: Path | None) -> Iterator[dict[str, Any]]:
    """The LLM config to use, serving a scripted server while it is in use."""
    if script is None:
        llm: dict[str, Any] = {"model": model, "base_url": base_url}
        if api_key:
            llm["api_key"] = api_key
        yield llm
        return
    from .testing import FakeLLMServer, load_script

    with FakeLLMServer(load_script(script)) as server:
        yield {"model": model or SCRIPTED_MODEL, "base_url": server.url,
               "api_key": SCRIPTED_KEY}


@main.command("fake-llm")
@click.option("--script", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--port", default=0, show_default=True, help="0 picks a free port.")
@click.option("--host", default="127.0.0.1", show_default=True)
def fake_llm(script: str, port: int, host: str) -> None:
    """Serve an OpenAI-compatible scripted LLM (for tests and demos) until interrupted."""
    from .testing import load_script
    from .testing.fake_llm import serve

    load_script(script)  # a bad script is a usage error before anything listens
    try:
        serve(script, host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CliError(f"port {port} on {host} is in use", ENVIRONMENT) from exc
        raise CliError(f"cannot listen on {host} port {port}: {os_message(exc)}",
                       ENVIRONMENT) from exc


@main.command()
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), envvar=HOME_ENV)
def sessions(home: Path | None) -> None:
    """List the sessions in the store, newest first."""
    from .masking import mask_known
    from .store import open_store

    store = open_store(open_home(home))
    try:
        for record in store.sessions():
            console.print(f"{record.session_id}  {record.state.value:<22} "
                          f"{record.updated_at:%Y-%m-%d %H:%M:%S}  "
                          f"{mask_known(record.config.task)[:60]}")
    finally:
        store.close()


@main.command()
@click.argument("session_id")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), envvar=HOME_ENV)
@click.option("--since", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
@click.option("-v", "--verbose", is_flag=True)
def events(session_id: str, home: Path | None, since: int, as_json: bool,
           verbose: bool) -> None:
    """Print a session's events from the store."""
    from .api import remember_session_secrets
    from .masking import known_masker
    from .render import render
    from .store import open_store

    trouper_home = open_home(home)
    store = open_store(trouper_home)
    try:
        store.session(session_id)  # an unknown id is an error before anything is printed
        remember_session_secrets(trouper_home, session_id)  # shown output is masked
        for event in store.read(session_id, since=since):
            if as_json:
                click.echo(known_masker().mask_event(event).model_dump_json())
            elif (line := render(event, verbose=verbose)) is not None:
                console.print(line)
    finally:
        store.close()


if __name__ == "__main__":  # pragma: no cover
    main(prog_name=os.path.basename(sys.argv[0]))
