"""The event store: the durable log that is the truth of every session (promise I3).

store = open_store(Home.at())
store.create_session("s1", config)
store.append("s1", [MessageEvent(source="user", text="fix the failing test")])
for event in store.follow("s1", timeout_s=5.0):
    ...
"""

from __future__ import annotations

from ..paths import Home
from .base import EventStore, SessionRecord
from .sqlite import SQLiteEventStore

__all__ = ["EventStore", "SQLiteEventStore", "SessionRecord", "open_store"]


def open_store(home: Home) -> EventStore:
    """The event store of a trouper home (today: SQLite at ``home.db_path``)."""
    return SQLiteEventStore(home.db_path)
