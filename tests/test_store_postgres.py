"""What only the PostgreSQL store does: its versioned schema, its URL's password kept out of
every message, its pool, its row lock fencing appends, and a server that goes away.

The contract both stores keep is tests/test_store_contract.py. These tests need the
tests' server (``postgres_url``: skipped without one, failed with TROUPER_REQUIRE_POSTGRES=1);
the one that kills a server starts a cluster of its own (scripts/postgres).
"""

from __future__ import annotations

import glob
import logging
import multiprocessing
import os
import re
import subprocess
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from trouper.config.models import LLMConfig, SessionConfig
from trouper.exceptions import LeaseLost, StoreError, StoreUnavailable
from trouper.messages.events import AgentState, MessageEvent, StateChanged
from trouper.store import PostgresEventStore, open_store
from trouper.store import postgres_schema as schema
from trouper.testing import wait_until

FORK = multiprocessing.get_context("fork")
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "postgres"


def make_config() -> SessionConfig:
    return SessionConfig(task="fix it", llm=LLMConfig(model="m"), workspace="/tmp/ws")


def msg(text: str) -> MessageEvent:
    return MessageEvent(source="user", text=text)


def raw_version(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute(f"SELECT version FROM {schema.VERSION_TABLE}").fetchone()[0])


def set_raw_version(url: str, version: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema.VERSION_TABLE} SET version = %s", (version,))


# ---- chosen by URL, schema made and migrated -------------------------------------------


def test_open_store_picks_postgresql_for_both_schemes(postgres_url: str):
    for url in (postgres_url, postgres_url.replace("postgresql://", "postgres://", 1)):
        store = open_store(url)
        try:
            assert isinstance(store, PostgresEventStore)
            store.create_session(f"s-{len(url)}", make_config())
        finally:
            store.close()
    assert raw_version(postgres_url) == schema.current_version() == schema.SCHEMA_VERSION


def test_an_older_schema_is_upgraded_in_one_transaction(postgres_url: str, monkeypatch):
    real = dict(schema.MIGRATIONS)
    for version in [v for v in real if v > 1]:  # a database made by the first schema
        monkeypatch.delitem(schema.MIGRATIONS, version)
    store = open_store(postgres_url)
    store.create_session("s1", make_config())
    store.append("s1", [msg("kept")])
    store.close()
    assert raw_version(postgres_url) == 1
    note = "ALTER TABLE sessions ADD COLUMN note TEXT NOT NULL DEFAULT 'migrated'"
    monkeypatch.setitem(schema.MIGRATIONS, 2, [*real[2], note, "SELECT 1 / 0"])  # fails late
    with pytest.raises(StoreError, match="division by zero"):
        open_store(postgres_url).last_seq("s1")
    assert raw_version(postgres_url) == 1
    with psycopg.connect(postgres_url) as conn:  # the first statements were rolled back too
        columns = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'sessions'")}
        daemons = conn.execute("SELECT to_regclass('daemons')").fetchone()
    assert "note" not in columns and "daemon" not in columns and daemons == (None,)
    monkeypatch.setitem(schema.MIGRATIONS, 2, [*real[2], note])
    store = open_store(postgres_url)
    try:
        assert [e.text for e in store.read("s1")] == ["kept"]
        assert raw_version(postgres_url) == 2
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("SELECT note, daemon FROM sessions").fetchone() == \
                ("migrated", None)
    finally:
        store.close()


def test_a_newer_schema_is_refused_naming_both_versions(postgres_url: str):
    store = open_store(postgres_url)
    store.sessions()
    store.close()
    set_raw_version(postgres_url, 99)
    store = open_store(postgres_url)
    try:
        with pytest.raises(StoreError, match=rf"schema version 99, newer than the "
                                             rf"{schema.SCHEMA_VERSION} .*upgrade trouper"):
            store.sessions()
    finally:
        store.close()


def open_and_create(url: str, session_id: str, go) -> None:
    go.wait(10)
    s = open_store(url)
    s.create_session(session_id, make_config())
    s.append(session_id, [msg("hello")])
    s.close()


def test_processes_racing_to_make_the_schema_of_a_fresh_database(postgres_url: str):
    go = FORK.Event()
    ids = [f"s{n}" for n in range(6)]
    procs = [FORK.Process(target=open_and_create, args=(postgres_url, sid, go)) for sid in ids]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * len(ids)
    s = open_store(postgres_url)
    try:
        assert sorted(r.session_id for r in s.sessions()) == ids
        assert all(s.last_seq(sid) == 1 for sid in ids)
    finally:
        s.close()


# ---- the password ------------------------------------------------------------------


def with_password(url: str, password: str, port: int | None = None) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{password}@{parts.hostname}:{port or parts.port}"
    return parts._replace(netloc=netloc).geturl()


def everything_said(error: BaseException, caplog) -> str:
    """The error, its chain and traceback, and every log line: what a user could see."""
    return "".join(traceback.format_exception(error)) + repr(error) + caplog.text


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_password_is_never_in_an_error_or_a_log(postgres_url: str, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "Wrong-pw-7f3a9c"
    host, port = urlsplit(postgres_url).hostname, urlsplit(postgres_url).port
    cases = [(with_password(postgres_url, wrong), StoreError, "user and password"),
             (with_password(postgres_url, wrong, free_port()), StoreUnavailable, "refused")]
    for url, kind, why in cases:
        store = open_store(url)
        assert wrong not in repr(store)
        with pytest.raises(kind) as caught:
            store.create_session("s1", make_config())
        store.close()
        said = everything_said(caught.value, caplog)
        assert f"{host}:{urlsplit(url).port}" in str(caught.value) and why in str(caught.value)
        assert wrong not in said
    real = urlsplit(postgres_url).password
    store = open_store(postgres_url)
    try:
        store.create_session("s1", make_config())
        assert real not in repr(store) and real not in caplog.text
    finally:
        store.close()
    assert port


# ---- the pool and the row lock -----------------------------------------------------


def connections_of(url: str) -> int:
    """How many of trouper's connections the server holds on the test's database."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'trouper%'").fetchone()[0]


def test_close_closes_the_pool_and_every_connection(postgres_url: str):
    store = PostgresEventStore(postgres_url, pool_size=3)
    assert connections_of(postgres_url) == 0  # opened lazily
    store.create_session("s1", make_config())
    stop = threading.Event()
    follower = threading.Thread(target=lambda: list(store.follow("s1", stop=stop)))
    follower.start()
    wait_until(lambda: connections_of(postgres_url) >= 2, what="the pool and the listener")
    pool = store._pool
    assert pool is not None and not pool.closed
    store.close()
    follower.join(2)
    assert not follower.is_alive() and pool.closed
    wait_until(lambda: connections_of(postgres_url) == 0, 5, "every connection to close")
    with pytest.raises(StoreError, match="closed"):
        store.last_seq("s1")


def test_a_batch_is_atomic_when_the_database_fails_mid_batch(postgres_url: str):
    store = open_store(postgres_url)
    try:
        store.create_session("s1", make_config())
        store.append("s1", [msg("first")])
        before = store.session("s1")
        with psycopg.connect(postgres_url, autocommit=True) as raw:
            raw.execute("CREATE FUNCTION fail() RETURNS trigger LANGUAGE plpgsql AS $$"
                        " BEGIN RAISE EXCEPTION 'injected failure'; END $$")
            raw.execute("CREATE TRIGGER fail_seq_3 BEFORE INSERT ON events FOR EACH ROW"
                        " WHEN (NEW.seq = 3) EXECUTE FUNCTION fail()")
            raw.execute("CREATE TRIGGER fail_pointer BEFORE UPDATE ON sessions FOR EACH ROW"
                        " WHEN (NEW.last_seq = 4) EXECUTE FUNCTION fail()")
            raw.execute("ALTER TABLE sessions DISABLE TRIGGER fail_pointer")
            batch = [msg("a"), msg("b"), StateChanged(state=AgentState.RUNNING, reason="go")]
            with pytest.raises(StoreError, match="injected failure"):  # amid the inserts
                store.append("s1", batch)
            assert store.session("s1") == before and store.read("s1", since=1) == []
            raw.execute("DROP TRIGGER fail_seq_3 ON events")
            raw.execute("ALTER TABLE sessions ENABLE TRIGGER fail_pointer")
            with pytest.raises(StoreError, match="injected failure"):  # moving the pointer
                store.append("s1", batch)
            assert store.session("s1") == before and store.read("s1", since=1) == []
            raw.execute("DROP TRIGGER fail_pointer ON sessions")
        assert [e.seq for e in store.append("s1", batch)] == [2, 3, 4]
        assert [e.seq for e in store.read("s1")] == [1, 2, 3, 4]
        assert store.session("s1").state == AgentState.RUNNING
    finally:
        store.close()


def lock_waiters(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                            " current_database() AND wait_event_type = 'Lock'").fetchone()[0]


@pytest.mark.parametrize("isolation", [None, "repeatable read"])
def test_an_append_waiting_behind_a_claim_reads_the_new_owner(postgres_url: str, isolation):
    """The owner check runs after the row lock: an append that queued behind a claim in
    flight sees that claim's token once it commits, and fails with LeaseLost. Also in a
    database whose default is REPEATABLE READ, where the check would read the old owner
    from a snapshot taken before the lock (the store pins READ COMMITTED)."""
    if isolation:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            name = admin.execute("SELECT current_database()").fetchone()[0]
            admin.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation"
                          f" = '{isolation}'")
    store = open_store(postgres_url)
    store.create_session("s1", make_config())
    old = store.claim_owner("s1")
    outcome: list[BaseException | None] = []

    def append() -> None:
        try:
            store.append("s1", [msg("late")], owner=old)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            outcome.append(e)

    try:
        with psycopg.connect(postgres_url) as claim:  # a claim, made by hand, in flight
            claim.execute("SELECT 1 FROM sessions WHERE id = 's1' FOR UPDATE")
            claim.execute("UPDATE session_meta SET value = %s WHERE session_id = 's1'"
                          " AND key = 'owner'", (str(old + 1),))
            writer = threading.Thread(target=append)
            writer.start()
            wait_until(lambda: lock_waiters(postgres_url) == 1, what="the append to queue")
            claimer = threading.Thread(target=store.claim_owner, args=("s1",))
            claimer.start()  # a real claim queues on the same lock
            wait_until(lambda: lock_waiters(postgres_url) == 2, what="the claim to queue")
        writer.join(10)
        claimer.join(10)
        assert isinstance(outcome[0], LeaseLost)
        assert store.read("s1") == [] and store.get_meta("s1", "owner") == str(old + 2)
    finally:
        store.close()


# ---- a server that goes away ---------------------------------------------------------


class OwnCluster:
    """A cluster of this module's own (scripts/postgres), which a test may kill."""

    def __init__(self) -> None:
        out = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True,
                             timeout=120, check=False)
        found = re.search(r"TROUPER_TEST_POSTGRES_DIR=(\S+) TROUPER_TEST_POSTGRES_URL=(\S+)",
                          out.stdout)
        if out.returncode or not found:
            pytest.fail(f"scripts/postgres start failed: {out.stderr[-2000:]}")
        self.dir, self.url = Path(found[1]), found[2]
        self.port = urlsplit(self.url).port
        self.bin = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1]
        with psycopg.connect(self.url, autocommit=True) as conn:  # the script's cluster
            conn.execute("ALTER SYSTEM SET synchronous_commit = on")  # would lose commits
            conn.execute("SELECT pg_reload_conf()")                   # to a kill

        def durable() -> bool:
            with psycopg.connect(self.url) as conn:
                return conn.execute("SHOW synchronous_commit").fetchone() == ("on",)

        wait_until(durable, what="synchronous_commit = on")

    def _pg_ctl(self, *args: str) -> None:
        owner = self.dir.owner()
        argv = [self.bin, *args, "-D", str(self.dir / "data")]
        if owner != os.environ.get("USER", "") and os.geteuid() == 0:
            argv = ["runuser", "-u", owner, "--", *argv]
        subprocess.run(argv, cwd=self.dir, check=True, capture_output=True, timeout=60)

    def kill(self) -> None:
        self._pg_ctl("stop", "-m", "immediate", "-w")

    def start(self) -> None:
        self._pg_ctl("start", "-w", "-l", str(self.dir / "log"), "-o", f"-p {self.port}")

    def remove(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "stop", str(self.dir)], capture_output=True,
                       timeout=120, check=False)


@pytest.fixture
def own_cluster(postgres_server: str) -> Iterator[OwnCluster]:
    cluster = OwnCluster()
    try:
        yield cluster
    finally:
        cluster.remove()


def test_a_server_gone_is_unavailable_and_the_store_carries_on_when_it_is_back(
        own_cluster: OwnCluster, caplog):
    store = PostgresEventStore(own_cluster.url, timeout_s=1.0)
    password = urlsplit(own_cluster.url).password
    try:
        store.create_session("s1", make_config())
        store.append("s1", [msg("before")])
        errors: list[BaseException] = []

        def follow() -> None:
            try:
                list(store.follow("s1", timeout_s=30))
            except StoreError as e:
                errors.append(e)

        follower = threading.Thread(target=follow)
        follower.start()
        own_cluster.kill()
        for call in (lambda: store.append("s1", [msg("while down")]),
                     lambda: store.read("s1"), lambda: store.claim_owner("s1")):
            with pytest.raises(StoreUnavailable) as caught:
                call()
            assert f"127.0.0.1:{own_cluster.port}" in str(caught.value)
            assert caught.value.kind == "unreachable" and caught.value.__cause__ is not None
            assert password not in everything_said(caught.value, caplog)
        follower.join(10)
        assert not follower.is_alive() and isinstance(errors[0], StoreUnavailable)
        own_cluster.start()
        [event] = store.append("s1", [msg("after")])
        assert event.seq == 2
        assert [e.text for e in store.read("s1")] == ["before", "after"]
    finally:
        store.close()


def test_connections_the_server_ended_are_replaced_without_an_error(postgres_url: str):
    store = open_store(postgres_url)
    try:
        store.create_session("s1", make_config())
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname"
                " = current_database() AND application_name = 'trouper'").fetchone()[0]
        assert ended >= 1
        assert [e.seq for e in store.append("s1", [msg("a")])] == [1]
    finally:
        store.close()


def close_what_was_inherited(conn: psycopg.Connection) -> None:
    conn.close()  # as a library's cleanup in a forked process might


def test_a_forked_child_cannot_end_the_parents_connection(postgres_url: str):
    """A child that closes a connection it inherited says goodbye to /dev/null, not on the
    parent's socket: the parent's transaction in flight carries on."""
    store = open_store(postgres_url)
    store.create_session("s1", make_config())
    try:
        with store.pooled("test") as conn, conn.transaction():
            conn.execute("SELECT 1 FROM sessions FOR UPDATE")
            child = FORK.Process(target=close_what_was_inherited, args=(conn,))
            child.start()
            child.join(30)
            assert child.exitcode == 0
            assert conn.execute("SELECT count(*) FROM sessions").fetchone() == (1,)
        assert store.append("s1", [msg("after the child")])[0].seq == 1
    finally:
        store.close()


def test_a_writer_cut_off_mid_append_cannot_keep_its_session_locked(postgres_url: str):
    """A host cut off in the middle of an append leaves its backend idle in the
    transaction, holding the session's row lock: the server ends such a backend after
    a few seconds (the store's session settings), so another host's claim goes through."""
    holder, claimer = open_store(postgres_url), open_store(postgres_url)
    holder.create_session("s1", make_config())
    release = threading.Event()
    locked = threading.Event()
    ended: list[BaseException | None] = []

    def hold() -> None:  # begins an append-like transaction, then says nothing more
        try:
            with holder.pooled("hold") as conn, conn.transaction():  # type: ignore[attr-defined]
                conn.execute("SELECT last_seq FROM sessions WHERE id = 's1' FOR UPDATE")
                locked.set()
                release.wait(60)
                conn.execute("SELECT 1")  # the server ended it meanwhile
            ended.append(None)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            ended.append(e)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(30)
        token = claimer.claim_owner("s1")  # blocks until the server ends the idle holder
        assert token >= 1
    finally:
        release.set()
        thread.join(timeout=30)
        holder.close()
        claimer.close()
    assert ended and ended[0] is not None  # the held transaction did not commit
