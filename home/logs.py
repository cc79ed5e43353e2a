"""Where and how trouper logs: ``<home>/logs/trouper.log``, one definition for the actor
system (Thespian's ``logDefs``) and the CLI's own handler. Light: it imports no actor
code, so a CLI command that fails early never pays for the actor system's imports.

The lines are text (``TEXT_FORMAT``), or JSON objects with ``TROUPER_LOG_FORMAT=json``
(``log_format.py``, which says what each holds)."""

from __future__ import annotations

import logging
from typing import Any

from .log_format import (
    JSON_FORMATTER,
    JsonFormatter,
    install_log_context,
    json_logs,
    set_log_role,
)
from .paths import Home, private_dir, private_file

TEXT_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
"""A text line: when, which process, how grave, which logger, what."""


def log_definitions(home: Home) -> dict[str, Any]:
    """Thespian ``logDefs`` for ``home``; creates the log files owner-only first.

    With JSON lines, this process's records get their context from now on
    (``install_log_context``), and so do the actor processes forked from it."""
    logs = private_dir(home.root / "logs")
    private_file(logs / "trouper.log")
    private_file(logs / "thespian.log")
    as_json = json_logs()
    if as_json:
        install_log_context()
    return {
        "version": 1,
        "formatters": {"json": {"()": JSON_FORMATTER}} if as_json
        else {"plain": {"format": TEXT_FORMAT}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(logs / "trouper.log"),
                              "formatter": "json" if as_json else "plain", "level": "INFO"}},
        "loggers": {"trouper": {"handlers": ["file"], "level": "INFO"}},
    }


def line_formatter(role: str) -> logging.Formatter:
    """The formatter of the log lines this process writes itself (the CLI, the daemon):
    text, or JSON, this process then named ``role`` in its records (the record context
    installed, so each carries its role and session wherever it is written)."""
    if not json_logs():
        return logging.Formatter(TEXT_FORMAT)
    set_log_role(role)
    install_log_context()
    return JsonFormatter(role)
