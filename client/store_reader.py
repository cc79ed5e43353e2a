"""``StoreReader``: a home's sessions read from its store, with no actor system.

What ``trouper sessions`` and ``trouper events`` use when no daemon runs for the home:
listing, states, events (followed as whoever drives the session appends them) and
waiting cost a store connection, not an actor system and litellm. It is a
``TrouperClient`` that drives nothing: ``start_session`` and every command raise
InvalidRequest saying what can (a ``Trouper``, or the home's daemon).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..exceptions import InvalidRequest
from ..home.paths import Home
from ..messages.events import AgentState
from .info import SessionSummary, state_filter
from .session import Session

if TYPE_CHECKING:
    from ..config.models import LLMConfig, RuntimeConfig
    from ..store import EventStore

READ_ONLY = ("{what}: this client reads the store of {home} only; open a Trouper on the "
             "home, or go through its daemon ('trouper daemon start')")


class StoreReader:
    """The sessions of ``home`` as its store holds them; commands refused."""

    def __init__(self, home: str | os.PathLike[str] | Home | None = None) -> None:
        from ..store import open_store  # looked up now: a test may have replaced it

        self.home = home if isinstance(home, Home) else Home.at(home)
        self.store: EventStore = open_store(self.home)

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store connection. Idempotent."""
        self.store.close()

    def start_session(self, task: str, *, llm: Mapping[str, Any] | LLMConfig,
                      runtime: str | Mapping[str, Any] | RuntimeConfig = "local",
                      workspace: str | os.PathLike[str] | None = None,
                      secrets: Mapping[str, str] | None = None,
                      session_id: str | None = None, **options: Any) -> Session:
        """Refused (InvalidRequest): starting a session takes an actor system."""
        raise InvalidRequest(READ_ONLY.format(what="start_session", home=self.home.root))

    def fork(self, session_id: str, at_seq: int | None = None, message: str | None = None,
             *, llm: Mapping[str, Any] | LLMConfig | None = None,
             workspace: str | os.PathLike[str] | None = None) -> Session:
        """Refused (InvalidRequest): a fork is a new session, which takes an actor system."""
        raise InvalidRequest(READ_ONLY.format(what="fork", home=self.home.root))

    def rewind(self, session_id: str, at_seq: int | None = None, message: str | None = None,
               *, llm: Mapping[str, Any] | LLMConfig | None = None,
               workspace: str | os.PathLike[str] | None = None) -> Session:
        """Refused (InvalidRequest): a rewind is a fork, which takes an actor system."""
        raise InvalidRequest(READ_ONLY.format(what="rewind", home=self.home.root))

    def sessions(self, state: AgentState | str | None = None, *,
                 replaced: bool = False) -> list[SessionSummary]:
        """Every session in the store, newest first; with ``state``, those in it; one a
        rewind replaced only with ``replaced``."""
        return summaries(self.store, state, replaced)

    def session(self, session_id: str) -> Session:
        """The session with that id (its commands refused). Raises UnknownSession."""
        self.store.session(session_id)
        return Session(self, session_id)

    # -- what a Session asks of its host ------------------------------------------------

    def fault(self, session_id: str, timeout_s: float | None = None) -> str | None:
        """None: only the actors that run a session know its faults, and none runs here."""
        return None

    def command(self, session_id: str, command: str, text: str = "", *,
                action_id: str = "") -> int:
        raise InvalidRequest(READ_ONLY.format(what=command, home=self.home.root))


def summaries(store: EventStore, state: AgentState | str | None,
              replaced: bool = False) -> list[SessionSummary]:
    """The store's sessions, newest first, in ``state`` when one is given; replaced ones
    (a rewind's originals) only with ``replaced``."""
    wanted = state_filter(state)
    return [SessionSummary.of_record(record) for record in store.sessions(replaced=replaced)
            if wanted is None or record.state == wanted]


__all__ = ["StoreReader", "summaries"]
