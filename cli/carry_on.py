"""Carrying a stored session on and following it: ``resume``, and ``approve`` / ``reject``
when no daemon runs.

Through the home's daemon when one runs (the session never gets a second actor system),
else in an actor system of this process, with the session's scripted model served again
at the address it knows (``--script FILE``, or the demo's by itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .clients import driving
from .drive import Begun, drive
from .next_steps import carry_on_flags
from .scripted import script_to_serve, serve
from .support import USAGE, CliError

if TYPE_CHECKING:
    from ..client.protocol import SessionHandle, TrouperClient
    from ..home.paths import Home

DAEMON_SCRIPT = ("--script serves the model from this process, which the daemon's session "
                 "outlives: serve it with 'trouper fake-llm --script FILE --port N'")

Act = Callable[["SessionHandle"], object]
"""What the command does to the session before following it (resume, approve...)."""


def carry_on(home: Home, session_id: str, script: Path | None, act: Act, *,
             timeout_s: float, verbose: bool) -> int:
    """Do ``act`` to the stored session, then follow it until it settles (as ``drive``);
    return the exit code."""
    from ..security.secrets_file import remember_session_secrets

    choice = driving(home, daemon=None)
    if choice.daemon_url is None:  # the model's scripted server, if any, must listen here
        served, port = script_to_serve(home, session_id, script)
    elif script is not None:
        raise CliError(DAEMON_SCRIPT + " at the address the session knows", USAGE)
    else:
        served, port = None, 0
    flags = carry_on_flags(home, script)

    def begin(client: TrouperClient) -> Begun:
        remember_session_secrets(home, session_id)  # shown output is masked
        session = client.session(session_id)
        before = session.info().last_seq
        act(session)
        return Begun(session, before, flags)

    with contextlib.ExitStack() as servers:  # before the actors: none of them takes the port
        if served is not None:
            serve(servers, served, port)
        return drive(choice, begin, timeout_s=timeout_s, verbose=verbose)


__all__ = ["DAEMON_SCRIPT", "Act", "carry_on"]
