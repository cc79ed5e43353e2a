"""The sandbox a session's runtime actor drives, built from the session's start."""

from __future__ import annotations

from pathlib import Path

from ..home.paths import Home
from ..messages.protocol import StartSession
from . import Sandbox, load_sandbox


def session_sandbox(start: StartSession) -> Sandbox:
    """The sandbox of the session ``start`` names, as its runtime actor drives it (not
    yet started): its backend, workspace, state folder, secrets (masked in its output)
    and output limit."""
    return load_sandbox(
        start.config.runtime,
        session_id=start.session_id,
        workspace=Path(start.config.workspace),
        state_dir=Home.at(start.home).runtime_dir(start.session_id),
        env=dict(start.secrets),
        secret_names=tuple(sorted(start.secrets)),  # the sandbox masks their values
        max_output_chars=start.config.max_output_chars,
    )
