"""The session API, one for every client: ``TrouperClient`` and ``SessionHandle``.

``Trouper`` (embedded: an actor system in your process) and ``Trouper.connect()`` (a
``RemoteTrouper``: a daemon's, over HTTP) both implement them, with the same signatures
and the same return types, so a program written against these runs either way::

    def make_hello(client: TrouperClient, llm: dict) -> AgentState:
        session = client.start_session("make hello.txt", llm=llm)
        for event in session.events(follow=True):
            print(event.seq, event.kind)
        return session.wait(timeout=600)

    with Trouper() as t:                # embedded
        make_hello(t, llm)
    with Trouper.connect() as t:        # the home's daemon
        make_hello(t, llm)

What differs is where the session lives: an embedded session stops working when its
``Trouper`` closes (it carries on at the next open), a daemon's goes on without its
client. Each side has a few members of its own, outside these protocols:
``Trouper.command``, ``Session.record``; ``RemoteTrouper.health``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

if TYPE_CHECKING:
    from ..config.models import LLMConfig, RuntimeConfig
    from ..core.fold import SessionView
    from ..messages.events import ActionEvent, AgentState, Event
    from ..workspace_diff import WorkspaceDiff
    from .info import SessionInfo, SessionSummary


class SessionHandle(Protocol):
    """One session: its state read from its log, and the user's commands.

    Not ``runtime_checkable``: ``isinstance`` would read every property, and a daemon's
    session answers each with a request (tests/test_client_protocol.py compares the
    members' signatures instead).

    Cheap to make and holds nothing. Every member raises UnknownSession for an id no
    session has. A command returns once the session has recorded it, with the seq of
    the last event it appended; one the session cannot take now raises InvalidRequest.
    """

    @property
    def id(self) -> str:
        """The session's id."""
        ...

    @property
    def state(self) -> AgentState:
        """The state in the log; ERROR while a storage fault keeps it from recording."""
        ...

    @property
    def fault(self) -> str | None:
        """Why the session cannot record anything right now (a full disk...), or None."""
        ...

    @property
    def workspace(self) -> str:
        """The absolute path of the folder the agent works in."""
        ...

    @property
    def awaiting_confirmation(self) -> ActionEvent | None:
        """The action waiting for the user's approval (confirmation mode), or None."""
        ...

    def info(self) -> SessionInfo:
        """The session at a glance: its summary, state, fault, cost, steps, config."""
        ...

    def view(self) -> SessionView:
        """The session folded from its whole log (state, cost, pending actions...)."""
        ...

    def diff(self) -> WorkspaceDiff:
        """What changed in the workspace since the session started (new, changed and
        deleted files, each with its unified diff); ``available`` False says why none
        can be made (no baseline, a workspace on another machine)."""
        ...

    def send(self, text: str) -> int:
        """Give the agent a message; a finished or waiting session runs again."""
        ...

    def pause(self) -> int:
        """Pause the session: it waits, its sandbox kept, until ``resume``."""
        ...

    def resume(self) -> int:
        """Carry a paused, stopped, rate-limited or failed session on."""
        ...

    def stop(self) -> int:
        """Stop the session and end its sandbox; ``resume`` goes on in a fresh one."""
        ...

    def approve(self, action_id: str = "") -> int:
        """Run the action waiting for approval; with ``action_id``, only if that is the
        one waiting (else InvalidRequest)."""
        ...

    def reject(self, reason: str = "", action_id: str = "") -> int:
        """Do not run the action waiting for approval: it is recorded ``rejected`` with
        ``reason`` (the agent reads it) and the session carries on."""
        ...

    def budget(self, max_cost_usd: float | None = None,
               max_iterations: int | None = None) -> int:
        """Set the budget from now on; a session paused for a spent budget carries on if
        the new one lasts (else InvalidRequest)."""
        ...

    def events(self, since: int = 0, *, follow: bool = False, until_settled: bool = True,
               timeout_s: float | None = None, stop: threading.Event | None = None
               ) -> Iterator[Event]:
        """Typed events with seq > ``since``, in order, each once.

        With ``follow``, keep yielding new events as they are appended: until the session
        is settled with nothing more in its log (``until_settled``), ``timeout_s`` passes,
        or ``stop`` is set (the iterator ends soon after, within a poll of 0.1 s). An
        unknown id raises UnknownSession at the call, not at the first event.
        """
        ...

    def wait(self, timeout: float | None = None) -> AgentState:
        """Block until the session is settled (or ``timeout`` seconds pass); return its
        state as ``state`` reads it. docs/api.md, ``Session.wait``, says what settled
        means and what is waited through."""
        ...


@runtime_checkable
class TrouperClient(Protocol):
    """Sessions to start, list and find: ``Trouper`` or a daemon's ``RemoteTrouper``.

    A context manager: leaving it closes the client.
    """

    def start_session(self, task: str, *, llm: Mapping[str, Any] | LLMConfig,
                      runtime: str | Mapping[str, Any] | RuntimeConfig = "local",
                      workspace: str | os.PathLike[str] | None = None,
                      secrets: Mapping[str, str] | None = None,
                      session_id: str | None = None, **options: Any) -> SessionHandle:
        """Start a session working on ``task`` and return it at once.

        ``options`` are the other fields of ``SessionConfig`` (``max_iterations``,
        ``confirm``, ``repo``...); docs/api.md has them all. ``session_id`` names the
        session (else a new ``s-...`` id); a daemon's client makes the create idempotent
        with it. Everything is checked before anything is made: ConfigError names the
        field at fault.
        """
        ...

    def fork(self, session_id: str, at_seq: int | None = None, message: str | None = None,
             *, llm: Mapping[str, Any] | LLMConfig | None = None,
             workspace: str | os.PathLike[str] | None = None) -> SessionHandle:
        """A new session starting where ``session_id`` was at event ``at_seq`` (None: its
        last), its workspace the checkpoint taken then (in ``workspace``, default its own
        folder); it waits for the user, or carries on with ``message``. The original is
        untouched (docs/time-travel.md)."""
        ...

    def rewind(self, session_id: str, at_seq: int | None = None, message: str | None = None,
               *, llm: Mapping[str, Any] | LLMConfig | None = None,
               workspace: str | os.PathLike[str] | None = None) -> SessionHandle:
        """``fork``, and the fork takes the original's place in ``sessions()``: the
        original is stopped if it is still working and marked replaced (its log and
        files kept; ``session(id)`` still opens it; docs/time-travel.md, "Rewind")."""
        ...

    def sessions(self, state: AgentState | str | None = None, *,
                 replaced: bool = False) -> list[SessionSummary]:
        """Every session, newest first; with ``state``, only those in it (ConfigError
        for a name that is no state); one a rewind replaced (its ``replaced_by`` set)
        only with ``replaced``."""
        ...

    def session(self, session_id: str) -> SessionHandle:
        """The session with that id; UnknownSession when none has it."""
        ...

    def close(self) -> object:
        """Let go of what this client holds: the embedded one its actor system and
        sandboxes (its sessions carry on at the next open), a daemon's client its
        connections (the daemon's sessions go on). Idempotent."""
        ...

    def __enter__(self) -> Self:
        ...

    def __exit__(self, *exc: object) -> None:
        ...


__all__ = ["SessionHandle", "TrouperClient"]
