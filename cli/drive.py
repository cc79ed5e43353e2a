"""Streaming one session from the command line: ``run``, ``demo`` and ``resume``.

``drive`` opens the client a command chose (``cli_clients``: an embedded ``Trouper``, or
the home's daemon), begins (starts or resumes) a session, streams its events until it
settles, closes the client, then prints a summary: the same calls either way. SIGINT,
SIGTERM and SIGHUP during all that ask for a graceful close (``Interrupts``); a second
signal exits at once. ``--timeout`` ends the same way. Where the session lives on makes
the one difference: an embedded session still working is paused (``_pause`` says why),
never finished or stopped by the signal, so ``trouper resume`` carries it on; a daemon's
goes on there (the command detaches).

In a terminal (stdin and stdout both TTYs), an action that waits for approval is asked
about at a prompt (``cli_approval_prompt``) and the following goes on with the answer;
elsewhere the command ends and its summary prints the ``approve`` and ``reject`` commands
(``cli_next_steps``).
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
from typing import TYPE_CHECKING

from rich.text import Text

from ..host.processes import SignalRelay, die_if_forked, signal_handlers
from ..security.masking import mask_known
from .approval_prompt import TerminalLines, answer_waiting
from .console import console, interactive
from .next_steps import how_to_go_on, next_rows
from .support import INTERRUPTED_BASE, OK, SESSION_FAILED

if TYPE_CHECKING:
    from ..client.info import SessionInfo
    from ..client.protocol import SessionHandle, TrouperClient
    from .clients import Choice

logger = logging.getLogger(__name__)


_WAITING_FOR_YOU = {"awaiting_user_confirmation": "waiting for your approval…",
                    "awaiting_user_input": "waiting for your answer…"}
"""What the spinner says while a session waits for the user (by state value)."""
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
DETACHED = ("detached: session {id} goes on in the daemon; follow it again with "
            "'trouper events {id} --follow'")


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
        self._relay = SignalRelay(self.stop.set)
        """Sets ``stop`` off the signal's context (a handler that set it could deadlock)."""

    @property
    def exit_code(self) -> int:
        return INTERRUPTED_BASE + (self.signum or 0)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @contextlib.contextmanager
    def installed(self) -> Iterator[Interrupts]:
        with self._relay, signal_handlers(HANDLED_SIGNALS, self._on_signal):
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
        self._relay.fire()


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

    session: SessionHandle
    since: int = 0
    """Stream the events after this seq (a resume shows only what is new)."""
    flags: str = ""
    """What a command that carries the session on needs besides its id (`` --script
    FILE``...): ``next_steps.carry_on_flags``."""


Begin = Callable[["TrouperClient"], Begun]
"""Starts or resumes a session through a client."""


@dataclass(frozen=True)
class Outcome:
    """What the summary says and the exit code derives from."""

    begun: Begun
    info: SessionInfo
    """The session once followed (and paused, if it was)."""
    in_daemon: bool
    """The session goes on in the daemon after the command (not paused)."""
    note: str
    """Why it stands where it is: the state's reason, or why the stream ended first."""

    @property
    def finished(self) -> bool:
        from ..messages.events import AgentState

        return self.info.state == AgentState.FINISHED


def drive(choice: Choice, begin: Begin, *, timeout_s: float, verbose: bool) -> int:
    """Open the chosen client, begin a session, stream it until it settles (or
    ``timeout_s``, or a signal), close the client, print a summary; return the exit code."""
    started = time.monotonic()
    interrupts = Interrupts()
    outcome = None
    in_daemon = choice.daemon_url is not None
    with interrupts.installed():
        with console.status(choice.opening):
            client = choice.open()
        try:
            if not interrupts.stop.is_set():
                begun = begin(client)
                if in_daemon:
                    console.print(f"[dim]in the daemon at {choice.daemon_url}: Ctrl-C "
                                  "detaches, the session goes on[/dim]")
                outcome = _follow(begun, timeout_s, verbose, interrupts, in_daemon)
        finally:
            closing = "closing: stopping the sandbox and the actors…" if not in_daemon \
                else "closing…"
            if interrupts.signum:
                closing = closing[:-1] + " (again to exit at once)"
            with console.status(closing):
                client.close()
    if outcome is not None:
        print_summary(outcome, time.monotonic() - started)
    if interrupts.signum:
        left = DETACHED.format(id=outcome.begun.session.id) if _goes_on(outcome) \
            else f"trouper: interrupted by {interrupts.name}: {_left(outcome)}"
        print(left, file=sys.stderr)
        return interrupts.exit_code
    return OK if outcome is not None and outcome.finished else SESSION_FAILED


def _follow(begun: Begun, timeout_s: float, verbose: bool, interrupts: Interrupts,
            in_daemon: bool) -> Outcome:
    """Stream the session until it settles; in a terminal, ask about each action that
    waits for approval and follow on (the time at the prompt is not counted)."""
    session = begun.session
    console.print(f"[bold]session {session.id}[/bold]")
    lines = TerminalLines() if interactive() else None
    since, deadline, answered = begun.since, time.monotonic() + timeout_s, ""
    while True:
        since = stream(session, max(deadline - time.monotonic(), 0.0), verbose, since=since,
                       stop=interrupts.stop, header=False)
        if lines is None or interrupts.stop.is_set() or time.monotonic() >= deadline:
            break
        asked_at = time.monotonic()
        answered = answer_waiting(session, lines, interrupts.stop, not_again=answered)
        deadline += time.monotonic() - asked_at
        if not answered:
            break
    return _outcome(begun, timeout_s, interrupts, in_daemon)


def _outcome(begun: Begun, timeout_s: float, interrupts: Interrupts,
             in_daemon: bool) -> Outcome:
    session = begun.session
    info = session.info()
    if interrupts.signum:
        note = f"interrupted by {interrupts.name}"
    elif not info.settled:
        note = f"still {info.state.value} when --timeout ({timeout_s:g} s) passed"
    else:
        note = info.reason
    if not info.settled and not in_daemon and _pause(session):
        info = session.info()
        note += "; paused while trouper closed"
    return Outcome(begun, info, in_daemon, note)


def _pause(session: SessionHandle) -> bool:
    """Pause a session that is still working, before trouper closes under it.

    Closing stops the sandbox, which kills the running command; an agent loop still
    RUNNING would take that as the command's failure and carry on (even finish) while
    the actors shut down. Paused, it waits: ``trouper resume`` carries it on, the
    killed command's outcome in its log.
    """
    from ..exceptions import TrouperError

    try:
        session.pause()
    except TrouperError as exc:  # it settled meanwhile, or the tree does not answer
        logger.info("session %s: not paused before closing: %s", session.id, exc)
        return False
    return True


def stream(session: SessionHandle, timeout_s: float, verbose: bool, since: int = 0,
           stop: threading.Event | None = None, header: bool = True) -> int:
    """Print the session's events as they come, until it settles, ``timeout_s`` passes or
    ``stop`` is set; return the seq of the last one."""
    from ..messages.events import ActionEvent, ObservationEvent, StateChanged
    from .render import describe_action, render

    if header:
        console.print(f"[bold]session {session.id}[/bold]")
    status = console.status("waiting for the model…")
    status.start()
    try:
        for event in session.events(since, follow=True, timeout_s=timeout_s, stop=stop):
            since = event.seq
            line = render(event, verbose=verbose)
            if line is not None:
                status.stop()
                console.print(line)
                status.start()
            if isinstance(event, ActionEvent):
                status.update(f"running {describe_action(event)[:60]}…")
            elif isinstance(event, ObservationEvent):
                status.update("waiting for the model…")
            elif isinstance(event, StateChanged) and event.state in _WAITING_FOR_YOU:
                status.update(_WAITING_FOR_YOU[event.state])
    finally:
        status.stop()
    return since


def print_summary(outcome: Outcome, elapsed_s: float) -> None:
    """A few aligned lines: state, steps, cost, time, workspace, id, how to go on."""
    info = outcome.info
    rows = [("state", info.state.value)]
    if outcome.note and not outcome.finished:
        rows.append(("reason", mask_known(outcome.note)))
    rows.append(("steps", f"{_count(info.iterations, 'model call')}, "
                          f"{_count(info.actions, 'action')}"))
    if info.cost_usd > 0:
        tokens = f"{info.prompt_tokens} + {info.completion_tokens} tokens"
        rows.append(("cost", f"${info.cost_usd:.4f} ({tokens})"))
    rows += [("elapsed", f"{elapsed_s:.1f} s"), ("workspace", info.workspace),
             ("session", info.id)]
    if outcome.in_daemon and not info.settled:  # it works on in the daemon
        rows.append(("follow", f"trouper events {info.id} --follow"))
    elif not outcome.finished:
        rows += next_rows(info.id, info.state, outcome.begun.flags, info.cause)
    style = "green" if outcome.finished else "yellow"
    console.print(Text("── summary", style=f"bold {style}"))
    for key, value in rows:  # never wrapped: a command must paste whole
        console.print(Text.assemble((f"{key:<10} ", "dim"), value), soft_wrap=True)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _goes_on(outcome: Outcome | None) -> bool:
    """The session works on in the daemon after the command (not waiting for you)."""
    return outcome is not None and outcome.in_daemon and \
        outcome.info.awaiting_confirmation is None


def _left(outcome: Outcome | None) -> str:
    """What an interrupted command left behind, in words."""
    if outcome is None:
        return "no session was started"
    info = outcome.info
    if outcome.finished:
        return f"session {info.id} had finished"
    return f"session {info.id} {how_to_go_on(info.id, info.state, outcome.begun.flags, info.cause)}"


__all__ = ["DETACHED", "Begun", "Interrupts", "Outcome", "console", "drive", "print_summary",
           "stream"]
