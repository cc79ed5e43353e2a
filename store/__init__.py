"""The event store: the durable log that is the truth of every session (I3, docs/promises.md).

A store is named by a URL: ``sqlite:///abs/path/trouper.db`` today (a ``postgresql://``
backend can come later, for sessions spread over hosts). ``open_store`` also takes a
``Home`` (its ``store_url``)::

    store = open_store(Home.at())                  # or open_store("sqlite:///tmp/t.db")
    store.create_session("s1", config)
    store.append("s1", [MessageEvent(source="user", text="fix the failing test")])
    for event in store.follow("s1", timeout_s=5.0):
        ...
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..exceptions import StoreError
from ..home.paths import Home
from .base import EventStore, SessionRecord
from .sqlite import SQLiteEventStore

__all__ = ["EventStore", "SQLiteEventStore", "SessionRecord", "open_store", "store_url"]

SCHEMES = ("sqlite",)
"""The URL schemes ``open_store`` knows."""


def store_url(home: Home) -> str:
    """The URL of a home's store."""
    return f"sqlite://{home.db_path.resolve()}"


def open_store(where: Home | str) -> EventStore:
    """The event store at a URL (``sqlite:///abs/path.db``), or a home's.

    Raises StoreError for a URL it cannot use, naming the schemes it knows.
    """
    url = store_url(where) if isinstance(where, Home) else where
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise StoreError(f"no event store for {url!r}: the known schemes are "
                         f"{', '.join(s + '://' for s in SCHEMES)}")
    path = unquote(parts.path)
    if parts.netloc or not path.startswith("/"):
        raise StoreError(f"a sqlite store URL names an absolute path, as in "
                         f"sqlite:///home/me/.trouper/trouper.db; got {url!r}")
    return SQLiteEventStore(Path(path))
