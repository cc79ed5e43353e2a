"""The event store: the durable log that is the truth of every session (I3, docs/promises.md).

A store is named by a URL: ``sqlite:///abs/path/trouper.db`` (the embedded default, one
file in the home) or ``postgresql://user:password@host:5432/dbname`` (also
``postgres://``; one database shared by several hosts, ``store/postgres.py``).
``open_store`` also takes a ``Home``: its store is ``$TROUPER_STORE`` when that is set,
else the home's SQLite file (``store_url``)::

    store = open_store(Home.at())                  # or open_store("sqlite:///tmp/t.db")
    store.create_session("s1", config)
    store.append("s1", [MessageEvent(source="user", text="fix the failing test")])
    for event in store.follow("s1", timeout_s=5.0):
        ...

The PostgreSQL backend is imported only when a ``postgresql://`` URL is opened, so a
program on SQLite never loads psycopg.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ..exceptions import StoreError
from ..home.paths import Home
from .base import EventStore, SessionRecord
from .sqlite import SQLiteEventStore

if TYPE_CHECKING:
    from .postgres import PostgresEventStore

__all__ = ["STORE_ENV", "EventStore", "PostgresEventStore", "SQLiteEventStore",
           "SessionRecord", "is_shared", "open_store", "shown_url", "store_url"]

SCHEMES = ("sqlite", "postgresql", "postgres")
"""The URL schemes ``open_store`` knows."""


STORE_ENV = "TROUPER_STORE"
"""The variable naming the store of every home this process opens (a URL); unset or
empty: each home's own SQLite file."""


def store_url(home: Home, given: str | None = None) -> str:
    """The URL of a home's store: ``given``, else ``$TROUPER_STORE``, else the home's
    SQLite file."""
    chosen = (given or os.environ.get(STORE_ENV, "")).strip()
    return chosen or f"sqlite://{home.db_path.resolve()}"


def is_shared(url: str) -> bool:
    """Whether the store at ``url`` can be shared by several hosts (PostgreSQL)."""
    return urlsplit(url).scheme in ("postgresql", "postgres")


def shown_url(url: str) -> str:
    """``url`` fit for a message or a log: its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def open_store(where: Home | str, **options: Any) -> EventStore:
    """The event store at a URL (``sqlite:///abs/path.db``, ``postgresql://...``), or a
    home's. ``options`` go to the store's class: ``pool_size`` and ``timeout_s`` for
    PostgreSQL, ``synchronous`` and ``busy_timeout_s`` for SQLite.

    Raises StoreError for a URL it cannot use, naming the schemes it knows (and never
    the URL's password).
    """
    url = store_url(where) if isinstance(where, Home) else where
    parts = urlsplit(url)
    if parts.scheme in ("postgresql", "postgres"):
        from .postgres import PostgresEventStore

        return PostgresEventStore(url, **options)
    if parts.scheme not in SCHEMES:
        raise StoreError(f"no event store for {shown_url(url)!r}: the known schemes are "
                         f"{', '.join(s + '://' for s in SCHEMES)}")
    path = unquote(parts.path)
    if parts.netloc or not path.startswith("/"):
        raise StoreError(f"a sqlite store URL names an absolute path, as in "
                         f"sqlite:///home/me/.trouper/trouper.db; got {url!r}")
    return SQLiteEventStore(Path(path), **options)


def __getattr__(name: str) -> Any:
    if name == "PostgresEventStore":  # without importing psycopg for SQLite's users
        from .postgres import PostgresEventStore

        return PostgresEventStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
