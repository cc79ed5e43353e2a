"""Where trouper keeps things under its home folder.

    <home>/trouper.db                      the event store (SQLite, WAL)
    <home>/sessions/<id>/                  one folder per session
    <home>/sessions/<id>/workspace/        the default workspace
    <home>/sessions/<id>/runtime/          the local sandbox: socket, pid, journal
    <home>/sessions/<id>/secrets.json      the session's secrets and API key (mode 0600)
    <home>/sessions/<id>/actors/<role>.pid the pid of the session's live actors
    <home>/actors/<role>.pid               the pid of the shared actors (root, broker)
    <home>/logs/                           trouper.log (actors), thespian.log
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "TROUPER_HOME"


def default_home() -> Path:
    """``$TROUPER_HOME``, else ``~/.trouper``."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".trouper")


@dataclass(frozen=True)
class Home:
    """The layout of one trouper home folder."""

    root: Path

    @classmethod
    def at(cls, path: str | os.PathLike[str] | None = None) -> Home:
        root = Path(path) if path is not None else default_home()
        root = root.expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
        return cls(root)

    @property
    def db_path(self) -> Path:
        return self.root / "trouper.db"

    def session_dir(self, session_id: str) -> Path:
        return self.root / "sessions" / session_id

    def default_workspace(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "workspace"

    def runtime_dir(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "runtime"

    def secrets_path(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "secrets.json"

    def actor_pid_path(self, role: str, session_id: str | None = None) -> Path:
        """Where a live actor publishes its pid (for the harness's ``kill_actor``)."""
        folder = self.session_dir(session_id) / "actors" if session_id else self.root / "actors"
        return folder / f"{role}.pid"
