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


def database_role(url: str, prefix: str = "trouper_role") -> Iterator[tuple[str, str]]:
    """A login role of its own (a unique name: roles are the server's, not a database's)
    that may read and write every table of the database at ``url``; yields (the database's
    URL as that role, the role's name), and drops the role when resumed. A test cuts a
    daemon off from the store by refusing this role's logins (``ALTER ROLE ... NOLOGIN``
    and ``pg_terminate_backend``), as a network partition between it and the server
    would, without touching the daemons that use another role."""
    import psycopg
    from psycopg import sql

    name = f"{prefix}_{secrets.token_hex(4)}"
    password = secrets.token_hex(16)
    role = sql.Identifier(name)
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            role, sql.Literal(password)))
        admin.execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(role))
        admin.execute(sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}").format(
            role))
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    try:
        yield urlunsplit(parts._replace(netloc=f"{name}:{password}@{host}")), name
    finally:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE usename = %s", (name,))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(role))
            admin.execute(sql.SQL("DROP ROLE {}").format(role))
