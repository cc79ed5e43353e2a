"""Where and how trouper logs: ``<home>/logs/trouper.log``, one definition for the actor
system (Thespian's ``logDefs``) and the CLI's own handler. Light: it imports no actor
code, so a CLI command that fails early never pays for the actor system's imports."""

from __future__ import annotations

from typing import Any

from .paths import Home, private_dir, private_file


def log_definitions(home: Home) -> dict[str, Any]:
    """Thespian ``logDefs`` for ``home``; creates the log files owner-only first."""
    logs = private_dir(home.root / "logs")
    private_file(logs / "trouper.log")
    private_file(logs / "thespian.log")
    return {
        "version": 1,
        "formatters": {"plain": {"format": "%(asctime)s %(process)d %(levelname)s "
                                           "%(name)s: %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(logs / "trouper.log"),
                              "formatter": "plain", "level": "INFO"}},
        "loggers": {"trouper": {"handlers": ["file"], "level": "INFO"}},
    }
