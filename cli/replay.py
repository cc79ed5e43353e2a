"""``trouper replay``: run a recorded session's model replies again against today's code
and tools, and say where its actions' outcomes first differ (``testing/replay.py``).

Exit 0: no divergence; 1: it diverged; 2: no replay could be made or finished (an unknown
session, a log without its model's replies, a config refused today, the replay not
settled within ``--timeout``). The report goes to stdout (``--json``: one object).
"""

from __future__ import annotations

from pathlib import Path

import click

from .clients import driving
from .support import OK, SESSION_FAILED, USAGE, CliError, home_option, open_home


@click.command("replay")
@click.argument("session_id")
@home_option
@click.option("--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="The replay's workspace, used as it is (empty, or a copy you made of "
              "what the original started from); default: a new empty one in the home.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=600.0,
              show_default=True, help="Seconds the whole replay may take.")
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
def replay(session_id: str, home: Path | None, workspace: Path | None, timeout_s: float,
           as_json: bool) -> None:
    """Replay SESSION_ID's model replies in a new session and report the first action
    whose outcome differs from the recorded one (status, exit code, content).

    The new session has the original's task, config and later messages; its model is a
    scripted server playing the recorded replies. Through the home's daemon when one
    runs, else in this process.
    """
    from ..exceptions import TrouperError
    from ..security.secrets_file import read_runtime_token, read_secrets, with_runtime_token
    from ..testing.replay import replay_session

    trouper_home = open_home(home)
    secrets, _ = read_secrets(trouper_home, session_id)
    token = read_runtime_token(trouper_home, session_id)
    try:
        with driving(trouper_home, daemon=None).open() as client:
            # a remote runtime's token is stored apart from the config, as the LLM key is
            config = with_runtime_token(client.session(session_id).info().config, token)
            runtime = config.runtime
            report = replay_session(client, session_id, workspace=workspace,
                                    secrets=secrets, runtime=runtime, timeout_s=timeout_s)
    except TrouperError as e:  # what keeps a replay from being made: exit 2, as documented
        raise CliError(f"cannot replay {session_id}: {e}", USAGE) from e
    click.echo(report.model_dump_json() if as_json else report.text())
    if not report.settled:
        raise CliError(f"the replay of {session_id} did not settle within {timeout_s:g} s",
                       USAGE)
    click.get_current_context().exit(SESSION_FAILED if report.diverged else OK)


__all__ = ["replay"]
