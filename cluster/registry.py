"""The cluster's records in the shared store: its daemons, where each session runs, and
the key check. Every daemon is a peer: any of them may declare a lapsed one dead and take
its sessions, each such change one transaction that the others see at once.

Times are the database's (``now()``), never a host's clock, so hosts whose clocks drift
still agree on whose heartbeat lapsed.

A daemon's row: its ``name`` (unique in the cluster), ``generation`` (one more at every
start: the fence), ``state`` (``alive``, ``draining`` while it hands its sessions over,
``stopped`` once it has, ``dead`` when its heartbeat lapsed; ``starting`` until its
actor system is open: it beats, but no session is placed on it yet), its address, its
capabilities (``local``, ``docker``, ``label:gpu=a100``...) and its heartbeat. A session's
``daemon`` column names the daemon that runs it; ``needs`` lists what a daemon must have
to run it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from ..core.states import RESTORABLE
from ..exceptions import ConfigError
from ..messages.events import AgentState
from ..store.postgres import PostgresEventStore
from .key import ClusterKey

STARTING, ALIVE, DRAINING, STOPPED, DEAD = "starting", "alive", "draining", "stopped", "dead"
GONE = (STOPPED, DEAD)
LIVING = (STARTING, ALIVE, DRAINING)
"""A daemon in these states beats (or should): its lapse makes it dead."""
_GONE_SQL, _LIVING_SQL = f"IN {GONE!r}", f"IN {LIVING!r}"
"""A daemon in these states runs nothing: its sessions are for the others to take."""
SETTLED_FOR_GOOD = (AgentState.FINISHED.value, AgentState.STOPPED.value)
"""A session in these states costs its daemon nothing (it is not counted as load)."""
_LIVE_LOAD = f"""(SELECT count(*) FROM sessions s WHERE s.daemon = d.name
                 AND s.state <> ALL(ARRAY{list(SETTLED_FOR_GOOD)}))"""


@dataclass(frozen=True)
class Me:
    """What a daemon registers about itself."""

    name: str
    url: str
    host: str
    home: str
    pid: int
    capabilities: tuple[str, ...]
    heartbeat_s: float
    dead_after_s: float


@dataclass(frozen=True)
class DaemonRecord(Me):
    """One daemon as the store knows it: what it registered, and how it is doing."""

    generation: int
    state: str
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float
    """Seconds since its last heartbeat, by the database's clock."""
    sessions: int
    """Sessions placed on it that are not finished or stopped."""
    end_reason: str

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["capabilities"] = list(self.capabilities)
        out["started_at"] = self.started_at.isoformat()
        out["heartbeat_at"] = self.heartbeat_at.isoformat()
        return out


_DAEMON_COLUMNS = ("name, generation, state, url, host, home, pid, capabilities, heartbeat_s,"
                   " dead_after_s, started_at, heartbeat_at,"
                   " extract(epoch FROM now() - heartbeat_at), {load}, end_reason")


class Registry:
    """The cluster's tables, on a PostgreSQL store's pool."""

    def __init__(self, store: PostgresEventStore) -> None:
        self.store = store

    @contextmanager
    def _tx(self, what: str) -> Iterator[psycopg.Connection]:
        with self.store.pooled(what) as conn, conn.transaction():
            yield conn

    # -- the key -------------------------------------------------------------------

    def check_key(self, key: ClusterKey) -> None:
        """Record the key's check value on a store with none; refuse (ConfigError) a key
        that is not the one the store has."""
        with self._tx("check the cluster key in") as conn:
            conn.execute("INSERT INTO cluster_facts (key, value) VALUES ('key_check', %s)"
                         " ON CONFLICT (key) DO NOTHING", (key.check_value,))
            row = conn.execute(
                "SELECT value FROM cluster_facts WHERE key = 'key_check'").fetchone()
        if row is None or row[0] != key.check_value:
            raise ConfigError(
                f"the cluster key in {key.path} is not this cluster's: copy the key file of "
                f"one of its daemons there (chmod 600)", field="cluster_key")

    def has_cluster(self) -> bool:
        """Whether a daemon ever recorded a cluster key on this store."""
        with self.store.pooled("read the cluster of") as conn:
            return conn.execute("SELECT 1 FROM cluster_facts WHERE key = 'key_check'"
                                ).fetchone() is not None

    # -- daemons -------------------------------------------------------------------

    def register(self, me: Me) -> int:
        """Join as ``me.name``; returns this start's generation (one more than the last).

        Refused (ConfigError) when a daemon of that name on another host or home is alive:
        two daemons must never share a name. The same host and home starting again is the
        same daemon after a crash: it takes the name over at once."""
        with self._tx("register a daemon in") as conn:
            row = conn.execute(
                "SELECT state, host, home, extract(epoch FROM now() - heartbeat_at),"
                " dead_after_s FROM daemons WHERE name = %s FOR UPDATE", (me.name,)).fetchone()
            if row is not None:
                state, host, home, age, dead_after = row
                if state in LIVING and age < dead_after and \
                        (host, home) != (me.host, me.home):
                    raise ConfigError(
                        f"a daemon named {me.name!r} runs on {host} ({home}), its heartbeat "
                        f"{age:.1f} s old: give this one another --name", field="name")
            values = (me.name, me.url, me.host, me.home, me.pid, list(me.capabilities),
                      me.heartbeat_s, me.dead_after_s)
            got = conn.execute(
                "INSERT INTO daemons (name, generation, state, url, host, home, pid,"
                " capabilities, heartbeat_s, dead_after_s, started_at, heartbeat_at)"
                " VALUES (%s, 1, 'starting', %s, %s, %s, %s, %s, %s, %s, now(), now())"
                " ON CONFLICT (name) DO UPDATE SET generation = daemons.generation + 1,"
                " state = 'starting', url = excluded.url, host = excluded.host,"
                " home = excluded.home, pid = excluded.pid,"
                " capabilities = excluded.capabilities, heartbeat_s = excluded.heartbeat_s,"
                " dead_after_s = excluded.dead_after_s, started_at = now(),"
                " heartbeat_at = now(), ended_at = NULL, end_reason = ''"
                " RETURNING generation", values).fetchone()
        assert got is not None
        return int(got[0])

    def heartbeat(self, name: str, generation: int) -> bool:
        """Say this daemon lives; False when it is fenced (declared dead, or another start
        of its name took over): it must stop running its sessions."""
        with self._tx("beat in") as conn:
            row = conn.execute(
                "UPDATE daemons SET heartbeat_at = now() WHERE name = %s AND generation = %s"
                f" AND state {_LIVING_SQL} RETURNING 1",
                (name, generation)
            ).fetchone()
        return row is not None

    def declare_dead(self) -> list[str]:
        """Every daemon whose heartbeat lapsed is dead from now on; their names."""
        with self._tx("find lapsed daemons in") as conn:
            rows = conn.execute(
                "UPDATE daemons SET state = 'dead', ended_at = now(),"
                " end_reason = 'its heartbeat lapsed'"
                f" WHERE state {_LIVING_SQL}"
                " AND heartbeat_at < now() - dead_after_s * interval '1 second'"
                " RETURNING name").fetchall()
        return [r[0] for r in rows]

    def set_state(self, name: str, generation: int, state: str, reason: str = "") -> None:
        """This start of ``name`` is ``alive`` (it serves), ``draining`` (no more sessions
        placed on it) or ``stopped``."""
        with self._tx("set a daemon's state in") as conn:
            conn.execute("UPDATE daemons SET state = %s, end_reason = %s,"
                         " ended_at = CASE WHEN %s = 'stopped' THEN now() END"
                         " WHERE name = %s AND generation = %s",
                         (state, reason, state, name, generation))

    def daemons(self) -> list[DaemonRecord]:
        """Every daemon the cluster ever had, live first, then by name."""
        with self.store.pooled("read the daemons of") as conn:
            rows = conn.execute(
                f"SELECT {_DAEMON_COLUMNS.format(load=_LIVE_LOAD)} FROM daemons d"
                " ORDER BY state <> 'alive', name").fetchall()
        return [DaemonRecord(
            name=r[0], generation=int(r[1]), state=r[2], url=r[3], host=r[4], home=r[5],
            pid=int(r[6]), capabilities=tuple(r[7]), heartbeat_s=float(r[8]),
            dead_after_s=float(r[9]), started_at=r[10], heartbeat_at=r[11],
            heartbeat_age_s=float(r[12]), sessions=int(r[13]), end_reason=r[14])
            for r in rows]

    # -- placement -----------------------------------------------------------------

    def place(self, needs: Sequence[str]) -> str | None:
        """The live daemon that has every capability in ``needs`` and runs the fewest
        sessions; None when no live daemon has them."""
        with self.store.pooled("place a session in") as conn:
            row = conn.execute(
                f"SELECT d.name FROM daemons d WHERE d.state = 'alive'"
                " AND d.heartbeat_at >= now() - d.dead_after_s * interval '1 second'"
                f" AND %s::text[] <@ d.capabilities ORDER BY {_LIVE_LOAD}, random() LIMIT 1",
                (list(needs),)).fetchone()
        return None if row is None else str(row[0])

    def set_placement(self, session_id: str, daemon: str, needs: Sequence[str]) -> None:
        with self._tx("place a session in") as conn:
            conn.execute("UPDATE sessions SET daemon = %s, needs = %s WHERE id = %s",
                         (daemon, list(needs), session_id))

    def placement(self, session_id: str) -> tuple[str | None, str | None, tuple[str, ...]]:
        """(the daemon the session is placed on, that daemon's state, the session's needs);
        (None, None, ()) for a session no daemon ever ran (an embedded program's)."""
        with self.store.pooled("read a session's daemon in") as conn:
            row = conn.execute(
                "SELECT s.daemon, d.state, s.needs FROM sessions s LEFT JOIN daemons d"
                " ON d.name = s.daemon WHERE s.id = %s", (session_id,)).fetchone()
        if row is None:
            return None, None, ()
        return row[0], row[1], tuple(row[2] or ())

    def take(self, session_id: str, me: str, capabilities: Sequence[str]) -> str | None:
        """Move the session to ``me`` when the daemon it is on is gone (or it was never on
        one: an embedded program's, now commanded through the cluster) and ``me`` has what
        it needs. Returns the home of the daemon it was on ('' for none, or ``me``'s own),
        or None when it is not ``me``'s."""
        with self._tx("take a session in") as conn:
            row = conn.execute(
                "WITH was AS (SELECT s.id, coalesce(d.home, '') AS home FROM sessions s"
                " LEFT JOIN daemons d ON d.name = s.daemon WHERE s.id = %s"
                " AND s.needs <@ %s::text[] AND (s.daemon = %s OR s.daemon IS NULL"
                f" OR d.state {_GONE_SQL}) FOR UPDATE OF s)"
                " UPDATE sessions SET daemon = %s FROM was WHERE sessions.id = was.id"
                " RETURNING was.home", (session_id, list(capabilities), me, me)).fetchone()
            if row is not None:
                _retarget_calls(conn, [session_id], me)
        return None if row is None else str(row[0])

    def adopt(self, me: str, capabilities: Sequence[str]) -> list[tuple[str, str]]:
        """Take this daemon's share of the working sessions of gone daemons (those it can
        run); each one's id and the home of the daemon it was on. Shares: the orphans
        divided by the live daemons, rounded up, so peers that adopt at once split them;
        SKIP LOCKED keeps two from taking one."""
        restorable = [s.value for s in RESTORABLE]
        with self._tx("adopt sessions in") as conn:
            counts = conn.execute(
                "SELECT (SELECT count(*) FROM sessions s JOIN daemons d ON d.name = s.daemon"
                f" WHERE d.state {_GONE_SQL} AND s.state = ANY(%s)),"
                " (SELECT count(*) FROM daemons WHERE state = 'alive')", (restorable,)
            ).fetchone()
            assert counts is not None
            orphans, live = int(counts[0]), max(1, int(counts[1]))
            if not orphans:
                return []
            rows = conn.execute(
                "WITH mine AS (SELECT s.id, d.home FROM sessions s JOIN daemons d"
                f" ON d.name = s.daemon WHERE d.state {_GONE_SQL}"
                " AND s.state = ANY(%s) AND s.needs <@ %s::text[] ORDER BY s.updated_at"
                " LIMIT %s FOR UPDATE OF s SKIP LOCKED)"
                " UPDATE sessions SET daemon = %s FROM mine WHERE sessions.id = mine.id"
                " RETURNING sessions.id, mine.home",
                (restorable, list(capabilities), math.ceil(orphans / live), me)).fetchall()
            adopted = [(str(r[0]), str(r[1])) for r in rows]
            _retarget_calls(conn, [session_id for session_id, _ in adopted], me)
        return adopted

    def hand_over(self, me: str, tell: Callable[[psycopg.Connection, str, str], None]
                  ) -> dict[str, str]:
        """A drain: each working session of ``me`` placed on the live peer with the fewest
        sessions that can run it, and ``tell(conn, session, peer)`` in the same
        transaction (the peer's call to carry it on: a crash can never leave a session
        placed on a peer that was not told); session id -> its new daemon. Sessions no
        peer can run stay (they go on at this daemon's next start)."""
        moved: dict[str, str] = {}
        restorable = [s.value for s in RESTORABLE]
        with self._tx("hand sessions over in") as conn:
            rows = conn.execute(
                "SELECT id, needs FROM sessions WHERE daemon = %s AND state = ANY(%s)"
                " FOR UPDATE", (me, restorable)).fetchall()
            for session_id, needs in rows:
                peer = conn.execute(
                    f"SELECT d.name FROM daemons d WHERE d.state = 'alive' AND d.name <> %s"
                    " AND d.heartbeat_at >= now() - d.dead_after_s * interval '1 second'"
                    f" AND %s::text[] <@ d.capabilities ORDER BY {_LIVE_LOAD}, random()"
                    " LIMIT 1", (me, list(needs or ()))).fetchone()
                if peer is None:
                    continue
                conn.execute("UPDATE sessions SET daemon = %s WHERE id = %s",
                             (peer[0], session_id))
                _retarget_calls(conn, [session_id], peer[0])
                tell(conn, session_id, peer[0])
                moved[session_id] = peer[0]
        return moved

    def placed_on(self, me: str) -> list[str]:
        """The working sessions placed on ``me`` (what it carries on when it starts)."""
        with self.store.pooled("read a daemon's sessions in") as conn:
            rows = conn.execute("SELECT id FROM sessions WHERE daemon = %s AND state = ANY(%s)",
                                (me, [s.value for s in RESTORABLE])).fetchall()
        return [r[0] for r in rows]


def _retarget_calls(conn: psycopg.Connection, session_ids: Sequence[str], daemon: str) -> None:
    """Calls for these sessions that no one answered go to their new daemon (taken ones
    too: a call carries its request id, so one carried out before is answered, not run
    again)."""
    if session_ids:
        conn.execute("UPDATE daemon_calls SET daemon = %s, taken_at = NULL"
                     " WHERE session_id = ANY(%s) AND answered_at IS NULL",
                     (daemon, list(session_ids)))
