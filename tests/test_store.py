"""The SQLite event store: what only it does (its file, its modes, its locks and its faults),
real processes, real kills. The contract every store keeps: tests/test_store_contract.py."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from trouper.config.models import LLMConfig, SessionConfig
from trouper.exceptions import StoreError
from trouper.home.paths import Home
from trouper.messages.events import (
    AgentState,
    MessageEvent,
    StateChanged,
)
from trouper.store import SQLiteEventStore, open_store

FORK = multiprocessing.get_context("fork")
API_KEY = "sk-test-DO-NOT-STORE-9f8e7d6c5b4a"


def make_config(**llm: object) -> SessionConfig:
    return SessionConfig(task="fix it", llm=LLMConfig(model="m", **llm), workspace="/tmp/ws")


def msg(text: str) -> MessageEvent:
    return MessageEvent(source="user", text=text)


def wait_until(condition, timeout_s: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


def join_all(procs: list[multiprocessing.Process], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0] * len(procs)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "trouper.db"


@pytest.fixture
def store(db: Path):
    s = SQLiteEventStore(db)
    yield s
    s.close()


def assert_consistent(store: SQLiteEventStore, session_id: str) -> list:
    events = store.read(session_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert store.last_seq(session_id) == len(events)
    return events


# ---- sessions ----------------------------------------------------------------------


def test_open_store_uses_the_home_db(tmp_path: Path):
    home = Home.at(tmp_path / "home")
    s = open_store(home)
    try:
        s.create_session("s1", make_config())
    finally:
        s.close()
    assert home.db_path.exists()


def test_newer_schema_is_refused_clearly(db: Path):
    SQLiteEventStore(db).close()
    with sqlite3.connect(db) as raw:
        raw.execute("PRAGMA user_version=99")
    raw.close()
    with pytest.raises(StoreError, match="schema version 99, newer"):
        SQLiteEventStore(db)


# ---- appends -----------------------------------------------------------------------


def test_batch_is_atomic_when_the_database_fails_mid_batch(store: SQLiteEventStore, db: Path):
    store.create_session("s1", make_config())
    store.append("s1", [msg("first")])
    before = store.session("s1")
    raw = sqlite3.connect(db)
    raw.execute(
        "CREATE TRIGGER fail_seq_3 BEFORE INSERT ON events WHEN NEW.seq = 3"
        " BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
    )
    raw.commit()
    batch = [msg("a"), msg("b"), StateChanged(state=AgentState.RUNNING, reason="go")]
    with pytest.raises(StoreError, match="injected failure"):
        store.append("s1", batch)
    assert store.session("s1") == before
    assert store.last_seq("s1") == 1
    raw.execute("DROP TRIGGER fail_seq_3")
    raw.commit()
    raw.close()
    assert [e.seq for e in store.append("s1", batch)] == [2, 3, 4]
    assert_consistent(store, "s1")


def test_api_key_is_never_stored(store: SQLiteEventStore, db: Path):
    store.create_session("s1", make_config(api_key=API_KEY))
    store.append("s1", [msg("hello")])
    assert store.session("s1").config.llm.api_key is None

    def stored_bytes() -> bytes:
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        return b"".join(p.read_bytes() for p in files if p.exists())

    assert Path(f"{db}-wal").exists()
    assert b"fix it" in stored_bytes()  # the check can see the config it looks through
    assert API_KEY.encode() not in stored_bytes()
    store.close()
    assert API_KEY.encode() not in stored_bytes()


STORE_SECRET = 'store-secret-"q/é\\z-41'
"""Registered in this process by the tests below: a value any store here must mask."""


def test_known_secrets_are_masked_in_the_config_and_every_event(db: Path):
    from trouper.security.masking import remember_secrets

    remember_secrets({"STORE_SECRET": STORE_SECRET})
    s = SQLiteEventStore(db)
    try:
        config = SessionConfig(task=f"use {STORE_SECRET}", llm=LLMConfig(model="m"),
                               workspace="/tmp/ws", system_prompt=f"p {STORE_SECRET}")
        s.create_session("s1", config)
        [stored] = s.append("s1", [msg(f"again {STORE_SECRET}")])
        record = s.session("s1")
    finally:
        s.close()
    assert record.config.task == "use <secret:STORE_SECRET>"
    assert record.config.system_prompt == "p <secret:STORE_SECRET>"
    assert stored.text == "again <secret:STORE_SECRET>"  # what is returned is what is stored
    raw = b"".join(p.read_bytes() for p in db.parent.iterdir() if p.name.startswith(db.name))
    assert b"store-secret" not in raw and b"<secret:STORE_SECRET>" in raw


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_database_wal_and_shm_are_owner_only_whatever_the_umask(db: Path):
    old = os.umask(0)
    try:
        s = SQLiteEventStore(db)
        s.create_session("s1", make_config())
        s.append("s1", [msg("hello")])
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        assert all(p.exists() for p in files)
        assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
        s.close()
    finally:
        os.umask(old)


def test_an_existing_loose_database_is_tightened_and_logged(db: Path, caplog):
    SQLiteEventStore(db).close()
    wal = Path(f"{db}-wal")
    wal.touch()
    for path in (db, wal):
        path.chmod(0o644)
    with caplog.at_level("WARNING", logger="trouper.store"):
        SQLiteEventStore(db).close()
    assert _mode(db) == 0o600
    assert not wal.exists() or _mode(wal) == 0o600
    assert "tightened" in caplog.text and str(db) in caplog.text


def test_a_read_only_database_stays_read_only(db: Path):
    SQLiteEventStore(db).close()
    db.chmod(0o444)
    try:
        SQLiteEventStore(db).close()
        assert _mode(db) == 0o400
    finally:
        db.chmod(0o600)


# ---- concurrency and crashes ---------------------------------------------------------


def append_many(store: SQLiteEventStore, session_id: str, tag: str, batches: int, go=None) -> None:
    # the child uses the store object it inherited through fork(): it must reopen
    if go is not None:
        go.wait(10)  # all writers start together, so their transactions contend
    for i in range(batches):
        store.append(session_id, [msg(f"{tag}:{i}:{j}") for j in range(1 + i % 3)])


def expected_texts(tag: str, batches: int) -> list[str]:
    return [f"{tag}:{i}:{j}" for i in range(batches) for j in range(1 + i % 3)]


def test_four_processes_on_four_sessions(store: SQLiteEventStore):
    ids = [f"s{n}" for n in range(4)]
    for session_id in ids:
        store.create_session(session_id, make_config())
    store.read("s0")  # the parent holds an open connection across the fork
    go = FORK.Event()
    procs = [FORK.Process(target=append_many, args=(store, sid, sid, 100, go)) for sid in ids]
    for p in procs:
        p.start()
    go.set()
    join_all(procs)
    for session_id in ids:
        texts = [e.text for e in assert_consistent(store, session_id)]
        assert texts == expected_texts(session_id, 100)


def append_forever(db: Path, session_id: str) -> None:
    s = SQLiteEventStore(db)
    i = 0
    while True:
        s.append(session_id, [msg(f"{i}-{j}") for j in range(5)] + [StateChanged(state="running")])
        i += 1


def test_sigkill_during_appends_leaves_the_log_consistent(store: SQLiteEventStore, db: Path):
    store.create_session("s1", make_config())
    for round_ in range(20):
        floor = store.last_seq("s1")
        child = FORK.Process(target=append_forever, args=(db, "s1"))
        child.start()
        target = floor + 6 * (1 + round_ * 3)  # kill at a different point each round
        wait_until(lambda t=target: store.last_seq("s1") >= t, what=f"seq {target}")
        os.kill(child.pid, signal.SIGKILL)
        child.join(5)
        assert child.exitcode == -signal.SIGKILL
    reopened = SQLiteEventStore(db)
    try:
        events = assert_consistent(reopened, "s1")
        assert len(events) % 6 == 0  # whole batches only
        raw = sqlite3.connect(db)
        (max_seq, count) = raw.execute("SELECT max(seq), count(*) FROM events").fetchone()
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        raw.close()
        assert max_seq == count == reopened.last_seq("s1") == len(events)
    finally:
        reopened.close()


def test_a_forked_child_opens_its_own_connection(store: SQLiteEventStore):
    store.create_session("s1", make_config())
    parent_conn = store._conn()
    answer = FORK.Queue()

    def child() -> None:
        answer.put(store._conn() is not parent_conn and store.last_seq("s1") == 0)

    proc = FORK.Process(target=child)
    proc.start()
    assert answer.get(timeout=10) is True
    join_all([proc])
    assert store._conn() is parent_conn


def test_parent_connections_survive_a_child_that_used_the_store(store: SQLiteEventStore):
    store.create_session("s1", make_config())
    readers = [threading.Thread(target=store.read, args=("s1",)) for _ in range(3)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(5)
    child = FORK.Process(target=append_many, args=(store, "s1", "child", 5))
    child.start()
    join_all([child])
    store.append("s1", [msg("parent after child")])
    events = assert_consistent(store, "s1")
    assert events[-1].text == "parent after child"


def open_and_create(db: Path, session_id: str, go) -> None:
    go.wait(10)
    s = SQLiteEventStore(db)
    s.create_session(session_id, make_config())
    s.append(session_id, [msg("hello")])
    s.close()


def test_processes_racing_to_create_a_new_database(db: Path):
    go = FORK.Event()
    ids = [f"s{n}" for n in range(4)]
    procs = [FORK.Process(target=open_and_create, args=(db, sid, go)) for sid in ids]
    for p in procs:
        p.start()
    go.set()
    join_all(procs)
    s = SQLiteEventStore(db)
    try:
        assert sorted(r.session_id for r in s.sessions()) == ids
        assert all(s.last_seq(sid) == 1 for sid in ids)
    finally:
        s.close()


def test_claiming_the_owner_fences_the_previous_writer(tmp_path):
    from trouper.exceptions import LeaseLost
    from trouper.messages.events import MessageEvent

    store = SQLiteEventStore(tmp_path / "t.db")
    store.create_session("s1", make_config())
    first = store.claim_owner("s1")
    store.append("s1", [MessageEvent(source="user", text="a")], owner=first)
    second = store.claim_owner("s1")
    assert second > first
    with pytest.raises(LeaseLost):
        store.append("s1", [MessageEvent(source="user", text="b")], owner=first)
    store.append("s1", [MessageEvent(source="user", text="c")], owner=second)
    assert [e.text for e in store.read("s1")] == ["a", "c"]
    store.close()


def test_a_config_an_older_trouper_stored_still_opens(tmp_path, caplog):
    """A value this version refuses (0 turned the soft timeout off once) is reset to its
    default on read, with a warning, rather than making the session unreadable."""
    import sqlite3

    from trouper.config.models import LLMConfig, SessionConfig
    from trouper.home.paths import Home
    from trouper.store import open_store

    home = Home.at(tmp_path / "home")
    store = open_store(home)
    store.create_session("s-old", SessionConfig(task="t", llm=LLMConfig(model="hosted_vllm/x"),
                                                workspace=str(tmp_path)))
    with sqlite3.connect(home.db_path) as conn:
        conn.execute("UPDATE sessions SET config_json = json_set(config_json, "
                     "'$.no_output_timeout_s', 0, '$.llm.timeout_s', -1) WHERE id = 's-old'")
    record = store.session("s-old")
    assert record.config.no_output_timeout_s == SessionConfig.model_fields[
        "no_output_timeout_s"].default
    assert record.config.llm.timeout_s == LLMConfig.model_fields["timeout_s"].default
    assert "no_output_timeout_s is no longer valid" in caplog.text
    store.close()


def test_a_store_is_named_by_a_url(tmp_path):
    from trouper.exceptions import StoreError
    from trouper.home.paths import Home
    from trouper.store import open_store, store_url

    home = Home.at(tmp_path / "my home")
    url = store_url(home)
    assert url == f"sqlite://{home.db_path.resolve()}"
    first = open_store(url)
    first.create_session("s-1", make_config())
    second = open_store(home)  # the same file, named by its home
    assert [r.session_id for r in second.sessions()] == ["s-1"]
    first.close()
    second.close()
    for bad in ("mysql://db/trouper", "sqlite://host/x.db", "sqlite:relative.db", "x"):
        with pytest.raises(StoreError, match="sqlite"):
            open_store(bad)
