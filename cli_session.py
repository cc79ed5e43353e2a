"""Streaming one session from the command line: ``run``, ``demo`` and ``resume``.

``drive`` opens a ``Trouper``, begins (starts or resumes) a session, streams its events
until it settles, closes every process it started, then prints a summary. SIGINT,
SIGTERM and SIGHUP during all that ask for a graceful close (``Interrupts``): a session
still working is paused (``_pause`` says why), never finished or stopped by the signal, so
``trouper resume`` carries it on; a second signal exits at once. ``--timeout`` ends the
same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from .cli_support import INTERRUPTED_BASE, OK, SESSION_FAILED
from .masking import mask_known
from .paths import Home
from .processes import die_if_forked, signal_handlers

if TYPE_CHECKING:
    from .api import Trouper
    from .fold import SessionView
    from .session import Session
    from .store import SessionRecord

logger = logging.getLogger(__name__)


class _FirstUseConsole:
    """rich's Console, made on first use: it reads the terminal's width and colour
    settings (COLUMNS, NO_COLOR...) then, not when this module is imported."""

    _console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if _FirstUseConsole._console is None:
            _FirstUseConsole._console = Console(highlight=False)
        return getattr(_FirstUseConsole._console, name)


console: Console = _FirstUseConsole()  # type: ignore[assignment]

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed) while a command drives a session.

    The first sets ``stop`` (the stream ends within 0.1 s, then trouper closes); a second
    one exits at once (128 + its number), leaving the actor system to end itself (its
    admin watches this process) and a sandbox server to exit when idle.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stop = threading.Event()
        self._pid = os.getpid()

    @property
    def exit_code(self) -> int:
        return INTERRUPTED_BASE + (self.signum or 0)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @contextlib.contextmanager
    def installed(self) -> Iterator[Interrupts]:
        with signal_handlers(HANDLED_SIGNALS, self._on_signal):
            yield self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if die_if_forked(self._pid, signum):
            return
        if self.signum is not None:
            os.write(2, b"trouper: interrupted again: exiting at once\n")
            os._exit(INTERRUPTED_BASE + signum)
        self.signum = signum
        if signum == signal.SIGHUP:  # the terminal is gone: what is left to say goes nowhere
            _detach_from_terminal()
        self.stop.set()


def _detach_from_terminal() -> None:
    """Point stdout and stderr at /dev/null where they were the closed terminal, so the
    graceful close does not die writing its summary (EIO) half-way."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            if os.isatty(fd):
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)


@dataclass(frozen=True)
class Begun:
    """A session a command began, and how a user would carry it on."""

    session: Session
    since: int = 0
    """Stream the events after this seq (a resume shows only what is new)."""
    resume_command: str = ""
    """How to carry the session on; ``trouper resume <id>`` when empty."""


Begin = Callable[["Trouper"], Begun]
"""Starts or resumes a session in an open Trouper."""


@dataclass(frozen=True)
class Outcome:
    """What the summary says and the exit code derives from."""

    begun: Begun
    view: SessionView
    record: SessionRecord
    state_value: str
    """The state as ``Session.state`` reads it (ERROR while a storage fault lasts)."""
    finished: bool
    note: str
    """Why it stands where it is: the state's reason, or why the stream ended first."""


def drive(home: Home, begin: Begin, *, timeout_s: float, verbose: bool) -> int:
    """Begin a session, stream it until it settles (or ``timeout_s``, or a signal), close
    trouper, print a summary; return the exit code."""
    from .api import Trouper

    started = time.monotonic()
    interrupts = Interrupts()
    outcome = None
    with interrupts.installed():
        with console.status("starting the actor system…"):
            trouper = Trouper(home=home.root, resume=False)
        try:
            if not interrupts.stop.is_set():
                begun = begin(trouper)
                outcome = _follow(begun, timeout_s, verbose, interrupts)
        finally:
            closing = "closing: stopping the sandbox and the actors…"
            if interrupts.signum:
                closing = closing[:-1] + " (again to exit at once)"
            with console.status(closing):
                trouper.close()
    if outcome is not None:
        print_summary(outcome, time.monotonic() - started)
    if interrupts.signum:
        print(f"trouper: interrupted by {interrupts.name}: {_left(outcome)}", file=sys.stderr)
        return interrupts.exit_code
    return OK if outcome is not None and outcome.finished else SESSION_FAILED


def _follow(begun: Begun, timeout_s: float, verbose: bool, interrupts: Interrupts) -> Outcome:
    from .messages.events import AgentState

    session = begun.session
    stream(session, timeout_s, verbose, since=begun.since, stop=interrupts.stop)
    view = session.view()
    if interrupts.signum:
        note = f"interrupted by {interrupts.name}"
    elif not view.settled:
        note = f"still {view.state.value} when --timeout ({timeout_s:g} s) passed"
    else:
        note = view.reason
    if not view.settled and _pause(session):
        view = session.view()
        note += "; paused while trouper closed"
    state = session.wait(timeout=0)
    return Outcome(begun, view, session.record, state.value, state == AgentState.FINISHED,
                   note)


def _pause(session: Session) -> bool:
    """Pause a session that is still working, before trouper closes under it.

    Closing stops the sandbox, which kills the running command; an agent loop still
    RUNNING would take that as the command's failure and carry on (even finish) while
    the actors shut down. Paused, it waits: ``trouper resume`` carries it on, the
    killed command's outcome in its log.
    """
    from .exceptions import TrouperError

    try:
        session.pause()
    except TrouperError as exc:  # it settled meanwhile, or the tree does not answer
        logger.info("session %s: not paused before closing: %s", session.id, exc)
        return False
    return True


def stream(session: Session, timeout_s: float, verbose: bool, since: int = 0,
           stop: threading.Event | None = None) -> None:
    """Print the session's events as they come, until it settles, ``timeout_s`` passes or
    ``stop`` is set."""
    from .messages.events import ActionEvent, ObservationEvent
    from .render import describe_action, render

    console.print(f"[bold]session {session.id}[/bold]")
    status = console.status("waiting for the model…")
    status.start()
    try:
        for event in session.events(since, follow=True, timeout_s=timeout_s, stop=stop):
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


def print_summary(outcome: Outcome, elapsed_s: float) -> None:
    """A few aligned lines: state, steps, cost, time, workspace, id, how to go on."""
    view, record = outcome.view, outcome.record
    rows = [("state", outcome.state_value)]
    if outcome.note and not outcome.finished:
        rows.append(("reason", mask_known(outcome.note)))
    rows.append(("steps", f"{_count(view.total_iterations, 'model call')}, "
                          f"{_count(view.actions, 'action')}"))
    if view.cost_usd > 0:
        tokens = f"{view.prompt_tokens} + {view.completion_tokens} tokens"
        rows.append(("cost", f"${view.cost_usd:.4f} ({tokens})"))
    rows += [("elapsed", f"{elapsed_s:.1f} s"), ("workspace", record.config.workspace),
             ("session", record.session_id)]
    if not outcome.finished:
        rows.append(("resume", _resume_command(outcome)))
    style = "green" if outcome.finished else "yellow"
    console.print(Text("── summary", style=f"bold {style}"))
    for key, value in rows:
        console.print(Text(f"{key:<10} ", style="dim") + Text(value))


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _left(outcome: Outcome | None) -> str:
    """What an interrupted command left behind, in words."""
    if outcome is None:
        return "no session was started"
    session_id = outcome.begun.session.id
    if outcome.finished:
        return f"session {session_id} had finished"
    return f"session {session_id} can be resumed with: {_resume_command(outcome)}"


def _resume_command(outcome: Outcome) -> str:
    from .messages.events import AgentState

    begun = outcome.begun
    command = begun.resume_command or f"trouper resume {begun.session.id}"
    if outcome.view.state == AgentState.AWAITING_USER_INPUT:
        return f"{command} -m 'YOUR ANSWER'"
    if outcome.view.state == AgentState.AWAITING_USER_CONFIRMATION:
        return f"{command} --approve  (or --reject 'WHY')"
    return command


__all__ = ["Begun", "Interrupts", "Outcome", "drive", "print_summary", "stream"]
