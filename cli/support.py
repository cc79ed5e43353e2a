"""What every ``trouper`` command shares: exit codes, one-line errors, the home and its log.

Exit codes (docs/cli.md has the table users read)::

    0    the session finished (other commands: they did what was asked)
    1    the session ended badly: ERROR, STOPPED, PAUSED, waiting for input, --timeout
    2    usage or configuration: a bad option, ConfigError, UnknownSession, a bad script
    3    environment: the home is not writable, a port is in use, the store is
         unavailable, the actor system did not start
    4    an exception trouper did not expect (a bug: retrying will not help)
    130  SIGINT (Ctrl-C), 143 SIGTERM: closed gracefully, the session stays resumable

Errors are reported once, here, by ``TrouperGroup.main``: one masked line on stderr,
``trouper: error: <message>``, the traceback only with ``--debug`` (or
``TROUPER_DEBUG=1``); the log file keeps the traceback either way.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from ..exceptions import ConfigError, InvalidRequest, TrouperError, UnknownSession
from ..home.paths import HOME_ENV, Home, default_home
from ..security.masking import mask_known
from ..testing.script import ScriptError

logger = logging.getLogger(__name__)

DEBUG_ENV = "TROUPER_DEBUG"
OK, SESSION_FAILED, USAGE, ENVIRONMENT, UNEXPECTED = 0, 1, 2, 3, 4
INTERRUPTED_BASE = 128
"""A signal's exit code is 128 + its number, as shells report it (SIGINT 130, SIGTERM 143)."""

_USAGE_ERRORS = (ConfigError, UnknownSession, InvalidRequest, ScriptError)
"""What the user can fix by changing the command line or a file they gave."""
_SHOWN = "trouper_shown"
"""Set on a log record the user already saw as the one-line error (not echoed again)."""


home_option = click.option(
    "--home", type=click.Path(file_okay=False, path_type=Path), envvar=HOME_ENV,
    help=f"trouper home (env {HOME_ENV}, default ~/.trouper).")
verbose_option = click.option("-v", "--verbose", is_flag=True,
                              help="Show thoughts, token counts, full output.")


class CliError(Exception):
    """An error with its exit code, raised where the CLI knows what went wrong."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def classify(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one-line message (masked) for an error."""
    code, message = _classify(exc)
    return code, one_line(mask_known(message))


def _classify(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, CliError):
        return exc.code, str(exc)
    if isinstance(exc, click.UsageError):
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        return USAGE, exc.format_message() + hint
    if isinstance(exc, click.ClickException):
        return USAGE, exc.format_message()
    if isinstance(exc, click.Abort | KeyboardInterrupt):
        return INTERRUPTED_BASE + 2, "interrupted"
    if isinstance(exc, _USAGE_ERRORS):
        return USAGE, str(exc)
    if isinstance(exc, TrouperError):
        return ENVIRONMENT, str(exc)
    if isinstance(exc, OSError):
        return ENVIRONMENT, os_message(exc)
    if type(exc).__module__.startswith("thespian."):
        return ENVIRONMENT, f"the actor system failed: {exc}"
    return UNEXPECTED, (f"unexpected {type(exc).__name__}: {exc} "
                        f"(run with --debug for the traceback)")


def os_message(exc: OSError) -> str:
    """``what: path`` without Python's ``[Errno N]`` noise."""
    what = exc.strerror or str(exc)
    return f"{what}: {exc.filename}" if exc.filename else what


def one_line(text: str) -> str:
    """Several lines (a script's problems, pydantic's report) joined into one."""
    out = ""
    for part in (line.strip() for line in text.splitlines()):
        if part:
            out += part if not out else (" " if out.endswith(":") else "; ") + part
    return out


class TrouperGroup(click.Group):
    """The ``trouper`` group: every command's errors become one line and an exit code."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        debug = self.debug_requested(argv)
        install_stderr_log()
        try:
            result = super().main(argv, prog_name, complete_var, standalone_mode=False,
                                  **extra)
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - every error ends as one line and a code
            code = report(exc, debug)
            if not standalone_mode:
                raise
            sys.exit(code)
        finally:
            remove_cli_logging()  # a caller in the same process (a test) gets its logging back
        # without standalone_mode click returns ctx.exit()'s code, or the command's value
        code = result if isinstance(result, int) else OK
        if standalone_mode:
            sys.exit(code)
        return result

    def debug_requested(self, argv: list[str]) -> bool:
        """``--debug`` before the command's name, or ``TROUPER_DEBUG``: known before
        parsing, so that a usage error shows its traceback too."""
        if os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes", "on"):
            return True
        for arg in argv:
            if arg in self.commands:
                return False
            if arg == "--debug":
                return True
        return False


def report(exc: BaseException, debug: bool) -> int:
    """Print an error as one line (and its traceback with ``debug``); return the code."""
    code, message = classify(exc)
    logger.error("exit %d: %s", code, message, exc_info=exc, extra={_SHOWN: True})
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    prefix = "trouper: " if code > INTERRUPTED_BASE else "trouper: error: "
    click.echo(prefix + message, err=True)
    return code


def open_home(path: Path | None) -> Home:
    """The home at ``path`` (``--home``/``TROUPER_HOME``, else ``~/.trouper``), created
    owner-only; a home that cannot be made or written is an environment error."""
    try:
        return Home.at(path)
    except OSError as exc:
        raise home_error(path, exc) from exc


def home_error(path: Path | None, exc: OSError) -> CliError:
    where = (path or default_home()).expanduser()
    return CliError(f"cannot use the trouper home {where}: {os_message(exc)}", ENVIRONMENT)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (a test runner swaps it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _OneLine(logging.Formatter):
    """``trouper: warning: <message>``, masked, on one line like the errors."""

    def format(self, record: logging.LogRecord) -> str:
        return f"trouper: {record.levelname.lower()}: {one_line(record.getMessage())}"


def install_stderr_log() -> None:
    """Warnings on stderr as ``trouper: warning: ...``; nothing below WARNING.

    On the root logger, not ``trouper``'s: actor processes forked later move trouper's
    loggers under Thespian's root, so they do not write to this terminal twice.
    """
    remove_cli_logging()
    root = logging.getLogger()
    stderr = _Stderr()
    stderr.setLevel(logging.WARNING)
    stderr.setFormatter(_OneLine())
    stderr.addFilter(lambda record: not getattr(record, _SHOWN, False))
    stderr._trouper_cli = True  # type: ignore[attr-defined]
    root.addHandler(stderr)


def log_to_home(home: Home, debug: bool) -> Path:
    """Append this process's trouper records to ``<home>/logs/trouper.log`` too.

    The file, its format and its level are the actors' (``actor_system``'s log
    definitions, which also create the file owner-only), so there is one definition;
    JSON lines name this process ``cli``. With ``debug``, this process logs at DEBUG.
    """
    from ..home.logs import line_formatter, log_definitions

    try:
        defs = log_definitions(home)
    except OSError as exc:
        raise home_error(home.root, exc) from exc
    spec = defs["handlers"]["file"]
    handler = logging.FileHandler(spec["filename"], encoding="utf-8")
    handler.setLevel(logging.DEBUG if debug else spec["level"])
    handler.setFormatter(line_formatter("cli"))
    handler._trouper_cli = True  # type: ignore[attr-defined]
    logging.getLogger().addHandler(handler)
    logging.getLogger("trouper").setLevel(
        logging.DEBUG if debug else defs["loggers"]["trouper"]["level"])
    return Path(spec["filename"])


def remove_cli_logging() -> None:
    """Take the handlers and the level the CLI set off again (idempotent)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_trouper_cli", False)]:
        root.removeHandler(handler)
        handler.close()
    logging.getLogger("trouper").setLevel(logging.NOTSET)


def debug_enabled() -> bool:
    """Whether the running command was given ``--debug`` (or ``TROUPER_DEBUG``)."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return bool(root is not None and root.params.get("debug"))

