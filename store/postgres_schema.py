"""The PostgreSQL store's schema, made and migrated by trouper, versioned.

The version lives in a one-row table ``trouper_schema_version``. ``MIGRATIONS[n]`` is the
list of statements that take a database from version ``n - 1`` to ``n`` (version 0 is an
empty database); ``ensure_schema`` runs the missing ones in order, in ONE transaction, so a
failed upgrade leaves the database at the version it had. Several processes opening a
fresh database at once do not race: the step runs under an advisory lock, taken before
its transaction begins, and re-reads the version once it holds it. A database newer than
this trouper knows is refused (a StoreError naming both versions): an older trouper must
not write into a schema it does not know.

To change the schema: append ``MIGRATIONS[SCHEMA_VERSION + 1]`` and raise nothing else;
``SCHEMA_VERSION`` follows.
"""

from __future__ import annotations

import logging

import psycopg

from ..exceptions import StoreError

logger = logging.getLogger(__name__)

MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            ord BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
            config_json TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL,
            last_seq BIGINT NOT NULL DEFAULT 0,
            state TEXT NOT NULL,
            state_reason TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX sessions_newest ON sessions (created_at DESC, ord DESC)",
        """CREATE TABLE events (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq BIGINT NOT NULL,
            kind TEXT NOT NULL,
            source TEXT NOT NULL,
            action_id TEXT,
            ts TIMESTAMPTZ NOT NULL,
            body_json TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
        """CREATE INDEX events_by_action ON events (session_id, action_id)
            WHERE action_id IS NOT NULL""",
        """CREATE TABLE session_meta (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (session_id, key)
        )""",
    ],
    2: [  # the cluster of daemons on this store (cluster/)
        """CREATE TABLE daemons (
            name TEXT PRIMARY KEY,
            generation BIGINT NOT NULL,
            state TEXT NOT NULL,
            url TEXT NOT NULL DEFAULT '',
            host TEXT NOT NULL DEFAULT '',
            home TEXT NOT NULL DEFAULT '',
            pid INTEGER NOT NULL DEFAULT 0,
            capabilities TEXT[] NOT NULL DEFAULT '{}',
            heartbeat_s DOUBLE PRECISION NOT NULL,
            dead_after_s DOUBLE PRECISION NOT NULL,
            started_at TIMESTAMPTZ NOT NULL,
            heartbeat_at TIMESTAMPTZ NOT NULL,
            ended_at TIMESTAMPTZ,
            end_reason TEXT NOT NULL DEFAULT ''
        )""",
        "ALTER TABLE sessions ADD COLUMN daemon TEXT",
        "ALTER TABLE sessions ADD COLUMN needs TEXT[] NOT NULL DEFAULT '{}'",
        "CREATE INDEX sessions_by_daemon ON sessions (daemon)",
        """CREATE TABLE daemon_calls (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            daemon TEXT NOT NULL,
            session_id TEXT,
            sealed BYTEA NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            taken_at TIMESTAMPTZ,
            answered_at TIMESTAMPTZ,
            answer BYTEA
        )""",
        "CREATE INDEX daemon_calls_waiting ON daemon_calls (daemon) WHERE answered_at IS NULL",
        "CREATE TABLE cluster_facts (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ],
}
"""Version -> the statements that take the version before it to it."""

SCHEMA_VERSION = max(MIGRATIONS)
"""The version this trouper writes; a database at a higher one is refused."""

VERSION_TABLE = "trouper_schema_version"
_LOCK_KEY = 0x7472_6F75_7065_72  # "trouper": the advisory lock of the schema step


def current_version() -> int:
    """The newest version ``MIGRATIONS`` knows (read at call time, so a test may add one)."""
    return max(MIGRATIONS)


def read_version(conn: psycopg.Connection) -> int:
    """The database's schema version; 0 when trouper never made its schema there."""
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,)).fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute(f"SELECT version FROM {VERSION_TABLE}").fetchone()
    return int(row[0]) if row else 0


def ensure_schema(conn: psycopg.Connection, where: str) -> int:
    """Make or upgrade the schema on ``conn`` (autocommit); returns the version it is at.

    ``where`` names the database in errors (host, port and name; never a password).
    """
    known = current_version()
    version = read_version(conn)
    if version == known:
        return version  # the common case: no lock, one cheap query
    _refuse_newer(version, known, where)
    # a session-level lock, taken BEFORE the transaction: a backend caches "no such table"
    # and only forgets it when a transaction starts, so a transaction begun before another
    # process made the schema would not see its tables (and would try to make them again)
    conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
    try:
        with conn.transaction():
            version = read_version(conn)  # another process may have done it meanwhile
            _refuse_newer(version, known, where)
            if version == known:
                return version
            if version == 0:
                conn.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER"
                             " NOT NULL, one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one))")
            for step in range(version + 1, known + 1):
                for statement in MIGRATIONS[step]:
                    conn.execute(statement)
            conn.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES (%s) ON CONFLICT"
                         " (one) DO UPDATE SET version = excluded.version", (known,))
    finally:
        if not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    logger.info("event store %s: schema version %d (was %d)", where, known, version)
    return known


def _refuse_newer(version: int, known: int, where: str) -> None:
    if version > known:
        raise StoreError(
            f"the event store {where} has schema version {version}, newer than the {known} "
            f"this trouper knows: upgrade trouper (every daemon on this store) to open it"
        )
