"""The ``trouper`` command line (docs/cli.md).

This module declares the group and the commands that run a session (``run``, ``demo``,
``resume``) and checks what they were given; its siblings add theirs: ``cli_reading``
(``sessions``, ``events``), ``cli_daemon`` (the daemon and the commands on its
sessions), ``cli_runtime_server``. Which client a command talks to (the home's daemon or
this process) is ``cli_clients``'s choice, made once; errors, exit codes and the log are
``cli_support``'s; streaming a session, signals and the summary ``cli_session``'s; the
demo and scripted servers ``cli_scripted``'s.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..config.files import KEYS
from ..home.paths import Home
from ..messages.events import AgentState
from .carry_on import DAEMON_SCRIPT, carry_on
from .clients import driving
from .drive import Begun, console, drive
from .mcp_options import mcp_option, mcp_options, secret_option
from .next_steps import carry_on_flags
from .run_defaults import api_key_from, chosen, confirm_policy, read_files, runtime_config
from .scripted import (
    DEMO_MODEL,
    DEMO_SCRIPT,
    DEMO_TASK,
    SCRIPTED_KEY,
    SCRIPTED_MODEL,
    port_error,
    serve,
)
from .support import (
    DEBUG_ENV,
    TrouperGroup,
    debug_enabled,
    home_option,
    log_to_home,
    open_home,
    verbose_option,
)

if TYPE_CHECKING:
    from ..client.protocol import SessionHandle, TrouperClient

MODEL_ENV = "TROUPER_MODEL"
BASE_URL_ENV = "TROUPER_BASE_URL"
NO_MODEL = (f"no model: give --model MODEL (or set {MODEL_ENV}, or model = \"MODEL\" in a "
            "config file: trouper config path), or --script FILE for a "
            "scripted one; to watch the built-in demo, run 'trouper demo' (or 'trouper run' "
            "with no task)")
DEMO_NO_WORKSPACE = ("the demo works in a fresh folder under the trouper home, never in a "
                     "folder you name: drop --workspace (or give a TASK and --model)")

timeout_option = click.option(
    "--timeout", "timeout_s", default=KEYS["timeout"].default, show_default=True,
    envvar=KEYS["timeout"].env,
    help="Stop following after this many seconds: the session is paused (in the daemon: "
         "it goes on), resume carries it on.")


@click.group(cls=TrouperGroup)
@click.version_option(package_name="trouper")
@click.option("--debug", is_flag=True, envvar=DEBUG_ENV,
              help=f"Print tracebacks with errors; log at DEBUG (env {DEBUG_ENV}=1).")
def main(debug: bool) -> None:
    """trouper: run LLM coding-agent sessions as supervised actors.

    Exit codes: 0 finished, 1 the session ended otherwise, 2 usage or configuration,
    3 environment, 4 unexpected, 130/143 interrupted (resumable). See docs/cli.md.
    """


@main.command()
@click.argument("task", required=False)
@click.option("--model", envvar=MODEL_ENV,
              help=f"litellm model, e.g. openai/gpt-4o (env {MODEL_ENV}); needed unless "
                   "--script.")
@click.option("--base-url", envvar=BASE_URL_ENV,
              help=f"API base of the model's server (env {BASE_URL_ENV}).")
@click.option("--api-key", help="API key; default: the provider's usual env var.")
@click.option("--api-key-env", envvar=KEYS["api_key_env"].env, metavar="NAME",
              help="The environment variable that holds the API key.")
@click.option("--runtime", default=KEYS["runtime"].default, show_default=True,
              envvar=KEYS["runtime"].env,
              type=click.Choice(["local", "docker", "remote"]),
              help="Where the shell runs: here, in a container (needs --image), or on a "
                   "runtime server (needs --url; its token in TROUPER_RUNTIME_TOKEN).")
@click.option("--image", envvar=KEYS["image"].env,
              help="The image of a --runtime docker session (any image with sh).")
@click.option("--url", "runtime_url", envvar=KEYS["url"].env,
              help="The runtime server of a --runtime remote session.")
@click.option("--no-network", is_flag=True, envvar=KEYS["no_network"].env,
              help="--runtime local: the shell opens no network socket (Docker has none "
                   "unless its config gives one).")
@click.option("--unconfined", is_flag=True, envvar=KEYS["unconfined"].env,
              help="--runtime local: the shell runs with all your rights (no Landlock or "
                   "seccomp): only for a task and a model you trust.")
@click.option("--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Folder the agent works in (default: a new folder under the home).")
@home_option
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Answer with a scripted LLM server (a JSON script) instead of a model.")
@click.option("--max-iterations", default=KEYS["max_iterations"].default, show_default=True,
              type=click.IntRange(1), envvar=KEYS["max_iterations"].env)
@click.option("--on-budget", type=click.Choice(["stop", "ask"]), default="stop",
              show_default=True,
              help="When --max-iterations runs out: stop the session, or ask (it pauses "
                   "until 'trouper budget ID' raises it).")
@click.option("--repo", help="Clone this git repository (URL or path) into the empty "
                             "workspace before the first step.")
@click.option("--branch", help="The branch or tag of --repo to check out.")
@click.option("--setup", help="A shell command run in the sandbox after the clone, before "
                              "the first step (a failure ends the session in ERROR).")
@click.option("--confirm", default=KEYS["confirm"].default, show_default=True,
              metavar="POLICY", envvar=KEYS["confirm"].env,
              help="Actions that wait for your approval: never, always, risky, or tool "
                   "names separated by commas (run,write_file,mcp).")
@mcp_option
@secret_option
@click.option("--daemon", is_flag=True,
              help="Run the session in the home's daemon (started if none runs) and follow "
                   "it; Ctrl-C detaches, the session goes on.")
@timeout_option
@verbose_option
def run(task: str | None, model: str | None, base_url: str | None, api_key: str | None,
        api_key_env: str | None, runtime: str, image: str | None, runtime_url: str | None,
        no_network: bool, unconfined: bool, workspace: Path | None, home: Path | None,
        script: Path | None, max_iterations: int, on_budget: str, repo: str | None,
        branch: str | None,
        setup: str | None, confirm: str, mcp_specs: tuple[str, ...],
        secret_names: tuple[str, ...], daemon: bool, timeout_s: float,
        verbose: bool) -> None:
    """Run one session on TASK and stream it; exit 0 when it FINISHED.

    With no TASK and no model, runs the built-in demo (as 'trouper demo'). With
    --daemon, in the home's daemon. What no flag gives comes from TROUPER_* variables,
    then the config files ('trouper config show').
    """
    if daemon and task is None:
        raise click.UsageError("--daemon needs a TASK (the demo runs in this process: "
                               "'trouper demo')")
    if daemon and script is not None:
        raise click.UsageError(DAEMON_SCRIPT + " and give --base-url")
    files = read_files(home, workspace or Path.cwd())
    if task is None and not model and not script:  # a file's model never turns off the demo
        if workspace is not None:
            raise click.UsageError(DEMO_NO_WORKSPACE)
        _exit(_demo(home, timeout_s, verbose))
    if task is None:
        raise click.UsageError("give a TASK (or run 'trouper demo' for the built-in demo)")
    keys = chosen(click.get_current_context(), files, *KEYS)
    if not keys["model"].value and not script:
        raise click.UsageError(NO_MODEL)
    llm: dict[str, Any] = {"model": keys["model"].value or SCRIPTED_MODEL,
                           "base_url": keys["base_url"].value}
    key = api_key or (api_key_from(keys) if script is None else None)
    if key:
        llm["api_key"] = key
    extra: dict[str, Any] = {name: value for name, value in
             (("repo", repo), ("branch", branch), ("setup", setup)) if value is not None}
    if on_budget != "stop":
        extra["on_budget"] = on_budget
    extra.update(mcp_options(files, mcp_specs, secret_names))
    _exit(_start(home, task, llm, script, daemon=daemon, timeout_s=keys["timeout"].value,
                 verbose=verbose, runtime=runtime_config(keys), workspace=workspace,
                 max_iterations=keys["max_iterations"].value,
                 confirm=confirm_policy(keys["confirm"].value), **extra))


@main.command()
@home_option
@click.option("--workspace", hidden=True, help="Refused: the demo never uses your folders.")
@timeout_option
@verbose_option
def demo(home: Path | None, workspace: str | None, timeout_s: float, verbose: bool) -> None:
    """Run the built-in demo in a fresh folder under the home (no key, no network).

    A scripted model on loopback has the agent write, run, test and improve a small
    program. It never works in a folder you name: --workspace is refused.
    """
    if workspace is not None:
        raise click.UsageError(DEMO_NO_WORKSPACE)
    read_files(home, Path.cwd())  # their [settings] apply; their model and runtime never do
    _exit(_demo(home, timeout_s, verbose))


def _demo(home: Path | None, timeout_s: float, verbose: bool) -> int:
    llm = {"model": DEMO_MODEL}
    return _start(home, DEMO_TASK, llm, DEMO_SCRIPT, daemon=False, timeout_s=timeout_s,
                  verbose=verbose)


def _start(home: Path | None, task: str, llm: dict[str, Any], script: Path | None, *,
           daemon: bool, timeout_s: float, verbose: bool, **options: Any) -> int:
    """Start a session (on a scripted server when ``script``) and drive it: in this
    process, or in the home's daemon with ``daemon``."""
    from ..testing import load_script

    loaded = load_script(script) if script is not None else None  # a bad file: exit 2 now
    trouper_home = _home_with_log(home)
    choice = driving(trouper_home, daemon=daemon)
    flags = carry_on_flags(trouper_home, script if script != DEMO_SCRIPT else None)
    with contextlib.ExitStack() as servers:  # left after drive: it answers until the end
        config = dict(llm)
        if loaded is not None:
            config.update(base_url=serve(servers, loaded), api_key=SCRIPTED_KEY)

        def begin(client: TrouperClient) -> Begun:
            if config["model"] == DEMO_MODEL:
                console.print("[dim]the built-in demo: a scripted LLM server on loopback "
                              "plays the model (give a TASK and --model for a real one)[/dim]")
            session = client.start_session(task, llm=config, **options)
            return Begun(session, 0, flags)

        return drive(choice, begin, timeout_s=timeout_s, verbose=verbose)


@main.command()
@click.argument("session_id")
@click.option("--message", "-m", help="Send this message to the agent (an answer, a hint); "
                                      "a paused session is resumed with it.")
@click.option("--approve", is_flag=True, help="Run the action waiting for your approval.")
@click.option("--reject", metavar="WHY", help="Do not run the action waiting for approval; "
                                              "the agent reads WHY.")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The script of a session run with --script: served again at the address "
                   "the session knows (a demo's is found by itself).")
@home_option
@timeout_option
@verbose_option
def resume(session_id: str, message: str | None, approve: bool, reject: str | None,
           script: Path | None, home: Path | None, timeout_s: float, verbose: bool) -> None:
    """Carry on a stored session (give it a message, or answer the action waiting for
    approval) and stream it until it settles.

    Through the home's daemon when one runs (--timeout and Ctrl-C then leave it going on
    there).
    """
    if sum((message is not None, approve, reject is not None)) > 1:
        raise click.UsageError("give one of --message, --approve and --reject")
    files = read_files(home, Path.cwd())  # their timeout and [settings] apply
    timeout_s = chosen(click.get_current_context(), files, "timeout")["timeout"].value

    def act(session: SessionHandle) -> object:
        if message:  # a paused session takes the message and waits: resume it too
            seq = session.send(message)
            return session.resume() if session.info().state == AgentState.PAUSED else seq
        if approve:
            return session.approve()
        if reject is not None:
            return session.reject(reject)
        return session.resume()

    _exit(carry_on(_home_with_log(home), session_id, script, act, timeout_s=timeout_s,
                   verbose=verbose))


def _home_with_log(home: Path | None) -> Home:
    trouper_home = open_home(home)
    log_to_home(trouper_home, debug_enabled())
    return trouper_home


def _exit(code: int) -> None:
    click.get_current_context().exit(code)


@main.command("fake-llm")
@click.option("--script", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--port", default=0, show_default=True, help="0 picks a free port.")
@click.option("--host", default="127.0.0.1", show_default=True)
def fake_llm(script: str, port: int, host: str) -> None:
    """Serve an OpenAI-compatible scripted LLM (for tests and demos) until interrupted."""
    from ..testing import load_script
    from ..testing.fake_llm import serve

    load_script(script)  # a bad script is a usage error before anything listens
    try:
        serve(script, host, port)
    except OSError as exc:
        raise port_error(host, port, exc) from exc


@main.group()
def runtime() -> None:
    """Sandbox runtimes: clean up what they leave behind."""


@runtime.command("gc")
@home_option
def runtime_gc(home: Path | None) -> None:
    """Remove the Docker containers of this home's sessions that are finished, stopped or
    gone from the store; never a container trouper did not label."""
    from ..exceptions import RuntimeUnavailable
    from ..runtimes.docker_support import docker_client, gc_sessions
    from ..store import open_store

    trouper_home = open_home(home)
    store = open_store(trouper_home)
    try:
        records = store.sessions()
    finally:
        store.close()
    try:
        removed = gc_sessions(trouper_home.root, records, docker_client(30.0))
    except RuntimeUnavailable as e:
        raise click.ClickException(str(e)) from e
    for name in removed:
        console.print(f"removed {name}")
    console.print(f"{len(removed)} container(s) removed")


# The sibling modules' commands, registered after the ones above.
from .audit import audit as _audit  # noqa: E402
from .config_cmd import config as _config  # noqa: E402
from .daemon import register as _register_daemon  # noqa: E402
from .diff import diff as _diff  # noqa: E402
from .fork import fork as _fork  # noqa: E402
from .fork import rewind as _rewind  # noqa: E402
from .reading import events, sessions  # noqa: E402
from .replay import replay as _replay  # noqa: E402
from .runtime_server import runtime_server  # noqa: E402
from .top import top as _top  # noqa: E402

main.add_command(sessions)
main.add_command(events)
main.add_command(runtime_server)
main.add_command(_top)
main.add_command(_diff)
main.add_command(_fork)
main.add_command(_rewind)
main.add_command(_config)
main.add_command(_audit)
main.add_command(_replay)
_register_daemon(main)

if __name__ == "__main__":  # pragma: no cover
    main(prog_name=os.path.basename(sys.argv[0]))
