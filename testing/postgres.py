"""A scratch database on a PostgreSQL server, for tests and benchmarks of the PostgreSQL
store: made with a name nothing else uses, dropped after (closing what still connects).

    for url in scratch_database("postgresql://postgres:PW@127.0.0.1:5433/postgres"):
        store = open_store(url)   # an empty database of its own
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit


def scratch_database(server_url: str, prefix: str = "trouper_scratch") -> Iterator[str]:
    """Make a database named ``<prefix>_<pid>_<random>`` on the server at ``server_url`` (a
    URL whose user may create databases), yield its URL, and drop it when resumed or
    closed (``DROP DATABASE ... WITH (FORCE)``); a generator, so a pytest fixture can
    ``yield from`` it and ``contextlib.contextmanager`` can wrap it."""
    import psycopg
    from psycopg import sql

    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(6)}"
    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                          .format(sql.Identifier(name)))
