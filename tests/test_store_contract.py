"""The event store's contract (store/base.py), run against every backend: SQLite and PostgreSQL.

Each test gets a fresh store of each kind (``opened``): SQLite in tmp_path, PostgreSQL in
a database of its own (the ``postgres_url`` fixture; skipped without a server, failed
with TROUPER_REQUIRE_POSTGRES=1). What only one backend does is tested beside it:
tests/test_store.py (SQLite's files, locks and faults), tests/test_store_postgres.py.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trouper.config.models import LLMConfig, SessionConfig
from trouper.exceptions import InvalidRequest, LeaseLost, StoreError, UnknownSession
from trouper.messages.actions import RunCommand
from trouper.messages.events import (
    ActionEvent,
    AgentState,
    LLMCompleted,
    MessageEvent,
    ObservationEvent,
    StateChanged,
)
from trouper.messages.outcomes import Outcome
from trouper.store import EventStore, open_store

FORK = multiprocessing.get_context("fork")
API_KEY = "sk-contract-DO-NOT-STORE-0a1b2c3d"
BACKENDS = ["sqlite", "postgresql"]


def make_config(**llm: object) -> SessionConfig:
    return SessionConfig(task="fix it", llm=LLMConfig(model="m", **llm), workspace="/tmp/ws")


def msg(text: str) -> MessageEvent:
    return MessageEvent(source="user", text=text)


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where this test's store lives: a URL ``open_store`` takes."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'trouper.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def opened(url: str) -> Iterator[Callable[[], EventStore]]:
    """``opened()``: a new store object on this test's store; all closed at the end."""
    stores: list[EventStore] = []

    def open_one() -> EventStore:
        stores.append(open_store(url))
        return stores[-1]

    yield open_one
    for s in stores:
        s.close()


@pytest.fixture
def store(opened: Callable[[], EventStore]) -> EventStore:
    return opened()


def assert_consistent(store: EventStore, session_id: str) -> list:
    events = store.read(session_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert store.last_seq(session_id) == len(events)
    return events


def every_kind_of_event() -> list:
    action = ActionEvent(action_id="a1", turn_id="t1", tool_call_id="call_1", tool="run",
                         arguments='{"command": "ls"}', action=RunCommand(command="ls"))
    return [
        msg("fix the failing test \u00e9 \u2603"),
        StateChanged(state=AgentState.RUNNING),
        LLMCompleted(request_id="r1", model="m", prompt_tokens=10, cost_usd=0.001),
        action,
        ObservationEvent(action_id="a1", outcome=Outcome(status="ok", content="x", exit_code=0)),
        StateChanged(state=AgentState.RATE_LIMITED, reason="429", resumes_at=datetime.now(UTC)),
    ]


# ---- sessions ----------------------------------------------------------------------


def test_create_read_and_list_sessions(store: EventStore):
    before = datetime.now(UTC)
    rec = store.create_session("s1", make_config())
    store.create_session("s2", make_config())
    assert rec.session_id == "s1" and rec.last_seq == 0
    assert rec.state == AgentState.LOADING and rec.state_reason == ""
    assert rec.created_at.tzinfo is not None and rec.created_at >= before.replace(microsecond=0)
    assert store.session("s1") == rec
    assert store.session("s1").config == make_config()
    assert [r.session_id for r in store.sessions()] == ["s2", "s1"]
    assert isinstance(store, EventStore)


def test_an_existing_or_empty_session_id_is_refused(store: EventStore):
    store.create_session("s1", make_config())
    with pytest.raises(InvalidRequest, match="s1"):
        store.create_session("s1", make_config())
    with pytest.raises(InvalidRequest):
        store.create_session("", make_config())
    assert [r.session_id for r in store.sessions()] == ["s1"]


def test_a_session_created_with_its_log_has_both_or_neither(store: EventStore):
    log = [MessageEvent(source="user", text="the task"),
           StateChanged(state=AgentState.PAUSED, reason="forked")]
    rec = store.create_session("s1", make_config(), log)
    assert (rec.last_seq, rec.state, rec.state_reason) == (2, AgentState.PAUSED, "forked")
    assert [(e.seq, e.kind) for e in store.read("s1")] == [(1, "message"), (2, "state")]
    with pytest.raises(InvalidRequest):  # the row exists: no second log slipped in
        store.create_session("s1", make_config(), log)
    assert len(store.read("s1")) == 2
    unstorable = MessageEvent.model_construct(source="user", text=object(), kind="message")
    with pytest.raises(StoreError):  # an event that cannot be written: no row either
        store.create_session("s2", make_config(), [unstorable])
    with pytest.raises(UnknownSession):
        store.session("s2")


def test_unknown_session_errors_name_the_id(store: EventStore):
    calls = [
        lambda: store.session("nope"),
        lambda: store.append("nope", [msg("x")]),
        lambda: store.append("nope", []),
        lambda: store.append("nope", [msg("x")], owner=1),
        lambda: store.read("nope"),
        lambda: store.last_seq("nope"),
        lambda: store.follow("nope", timeout_s=0.1),
        lambda: store.put_meta("nope", "k", "v"),
        lambda: store.get_meta("nope", "k"),
        lambda: store.claim_owner("nope"),
    ]
    for call in calls:
        with pytest.raises(UnknownSession, match="'nope'"):
            call()


def test_sessions_page_walks_newest_first_and_filters_by_state(store: EventStore):
    ids = [f"s{n}" for n in range(7)]
    for session_id in ids:
        store.create_session(session_id, make_config())
    for session_id in ids[::2]:
        store.append(session_id, [StateChanged(state=AgentState.FINISHED, reason="done")])
    assert [r.session_id for r in store.sessions()] == ids[::-1]
    pages, cursor = [], None
    while True:
        page, cursor = store.sessions_page(cursor=cursor, limit=3)
        pages.append([r.session_id for r in page])
        if cursor is None:
            break
        if len(pages) == 1:
            store.create_session("late", make_config())  # comes before the first page
    assert pages == [["s6", "s5", "s4"], ["s3", "s2", "s1"], ["s0"]]
    finished, more = store.sessions_page(states=[AgentState.FINISHED], limit=10)
    assert ([r.session_id for r in finished], more) == (["s6", "s4", "s2", "s0"], None)
    assert all(r.state == AgentState.FINISHED for r in finished)
    assert store.sessions_page(states=[], limit=10) == ([], None)
    whole, more = store.sessions_page(limit=100)
    assert [r.session_id for r in whole] == ["late", *ids[::-1]] and more is None
    for junk in ("nonsense", "x|y", "2026-01-01T00:00:00+00:00|-1", "|1"):
        with pytest.raises(InvalidRequest):
            store.sessions_page(cursor=junk)


def test_a_replaced_session_is_left_out_of_the_lists_when_asked(store: EventStore):
    from trouper.store.base import REPLACED_BY

    ids = [f"s{n}" for n in range(6)]
    for session_id in ids:
        store.create_session(session_id, make_config())
    store.append("s1", [StateChanged(state=AgentState.FINISHED, reason="done")])
    store.put_meta("s3", "owner", "7")  # another key: not a replacement
    for old, new in (("s1", "s5"), ("s2", "s4")):
        store.put_meta(old, REPLACED_BY, new)
    shown = ["s5", "s4", "s3", "s0"]
    assert [r.session_id for r in store.sessions(replaced=False)] == shown
    assert [r.session_id for r in store.sessions()] == ids[::-1]  # every one, by default
    every = {r.session_id: r.replaced_by for r in store.sessions()}
    assert every == {"s5": None, "s4": None, "s3": None, "s2": "s4", "s1": "s5", "s0": None}
    assert store.session("s1").replaced_by == "s5"  # still opened by its id, log and all
    assert store.session("s0").replaced_by is None and store.last_seq("s1") == 1
    pages, cursor = [], None
    while True:  # the cursor walks the shown sessions only, however the pages fall
        page, cursor = store.sessions_page(cursor=cursor, limit=2, replaced=False)
        pages.append([r.session_id for r in page])
        if cursor is None:
            break
    assert pages == [["s5", "s4"], ["s3", "s0"]]
    pages, cursor = [], None
    while True:
        page, cursor = store.sessions_page(cursor=cursor, limit=4)
        pages.append([(r.session_id, r.replaced_by) for r in page])
        if cursor is None:
            break
    assert pages == [[("s5", None), ("s4", None), ("s3", None), ("s2", "s4")],
                     [("s1", "s5"), ("s0", None)]]
    assert store.sessions_page(states=[AgentState.FINISHED], replaced=False) == ([], None)
    assert [r.session_id for r in store.sessions_page(
        states=[AgentState.FINISHED])[0]] == ["s1"]


def test_meta_put_and_get(store: EventStore):
    store.create_session("s1", make_config())
    store.create_session("s2", make_config())
    assert store.get_meta("s1", "request") is None
    store.put_meta("s1", "request", "digest-1")
    store.put_meta("s1", "request", "digest-2")
    store.put_meta("s1", "epoch", "3")
    assert store.get_meta("s1", "request") == "digest-2"
    assert store.get_meta("s1", "epoch") == "3"
    assert store.get_meta("s2", "request") is None


def test_the_api_key_is_never_stored_and_the_config_round_trips(store: EventStore, url: str,
                                                                 opened):
    store.create_session("s1", make_config(api_key=API_KEY))
    assert store.session("s1").config.llm.api_key is None
    assert store.session("s1").config == make_config()
    assert API_KEY not in raw_contents(url) and "fix it" in raw_contents(url)


CONTRACT_SECRET = 'contract-secret-"q/\u00e9\\z-77'
"""Registered in this process by the test below: a value any store here must mask."""


def test_known_secret_values_are_masked_in_the_config_and_every_event(store: EventStore,
                                                                      url: str):
    from trouper.security.masking import remember_secrets

    remember_secrets({"CONTRACT_SECRET": CONTRACT_SECRET})
    config = SessionConfig(task=f"use {CONTRACT_SECRET}", llm=LLMConfig(model="m"),
                           workspace="/tmp/ws")
    store.create_session("s1", config)
    [stored] = store.append("s1", [msg(f"again {CONTRACT_SECRET}")])
    assert store.session("s1").config.task == "use <secret:CONTRACT_SECRET>"
    assert stored.text == "again <secret:CONTRACT_SECRET>" == store.read("s1")[0].text
    raw = raw_contents(url)
    assert "contract-secret" not in raw and "<secret:CONTRACT_SECRET>" in raw


def raw_contents(url: str) -> str:
    """Every byte the store holds, as text (the check sees what it looks through)."""
    if url.startswith("sqlite://"):
        db = Path(url.removeprefix("sqlite://"))
        return b"".join(p.read_bytes() for p in db.parent.iterdir()
                        if p.name.startswith(db.name)).decode("utf-8", "replace")
    import psycopg

    with psycopg.connect(url) as conn:
        return "".join(str(row) for table in ("sessions", "events", "session_meta")
                       for row in conn.execute(f"SELECT * FROM {table}"))  # noqa: S608


# ---- appends -----------------------------------------------------------------------


def test_seq_is_contiguous_from_one_across_many_appends(store: EventStore):
    store.create_session("s1", make_config())
    returned = []
    for i in range(40):
        returned += store.append("s1", [msg(f"{i}-{j}") for j in range(i % 4)])
    events = assert_consistent(store, "s1")
    assert events == returned
    assert [e.text for e in events] == [f"{i}-{j}" for i in range(40) for j in range(i % 4)]


def test_append_returns_copies_and_moves_updated_at(store: EventStore):
    rec = store.create_session("s1", make_config())
    original = msg("hi")
    [stored] = store.append("s1", [original])
    assert original.seq == 0 and stored.seq == 1 and stored.text == "hi"
    assert store.session("s1").updated_at > rec.updated_at


def test_a_batch_is_all_or_nothing(store: EventStore):
    store.create_session("s1", make_config())
    store.append("s1", [msg("first")])
    before = store.session("s1")
    broken = MessageEvent.model_construct(text=object())
    with pytest.raises(StoreError, match="s1"):
        store.append("s1", [msg("a"), broken, StateChanged(state=AgentState.RUNNING)])
    assert store.session("s1") == before
    assert [e.text for e in assert_consistent(store, "s1")] == ["first"]
    assert [e.seq for e in store.append("s1", [msg("b"), msg("c")])] == [2, 3]


def test_state_follows_the_last_state_change(store: EventStore):
    store.create_session("s1", make_config())
    store.append("s1", [StateChanged(state=AgentState.RUNNING, reason="started")])
    store.append("s1", [msg("no state here")])
    rec = store.session("s1")
    assert (rec.state, rec.state_reason) == (AgentState.RUNNING, "started")
    store.append("s1", [StateChanged(state=AgentState.ERROR, reason="runtime died"), msg("x"),
                        StateChanged(state=AgentState.PAUSED, reason="user")])
    rec = store.session("s1")
    assert (rec.state, rec.state_reason, rec.last_seq) == (AgentState.PAUSED, "user", 5)


def test_read_since_and_limit(store: EventStore):
    store.create_session("s1", make_config())
    store.create_session("empty", make_config())
    store.append("s1", [msg(str(i)) for i in range(1, 11)])
    assert [e.seq for e in store.read("s1", since=7)] == [8, 9, 10]
    assert [e.seq for e in store.read("s1", since=2, limit=3)] == [3, 4, 5]
    assert store.read("s1", since=10) == []
    assert store.read("s1", limit=0) == []
    assert store.read("empty") == []


def test_a_reopened_store_replays_identically(opened):
    first = opened()
    first.create_session("s1", make_config())
    returned = first.append("s1", every_kind_of_event())
    record = first.session("s1")
    first.close()
    again = opened()
    assert again.read("s1") == returned
    assert [type(e) for e in again.read("s1")] == [type(e) for e in returned]
    assert again.session("s1") == record
    with pytest.raises(StoreError, match="closed"):
        first.last_seq("s1")
    first.close()  # idempotent


# ---- ownership ---------------------------------------------------------------------


def test_a_superseded_owner_cannot_append_and_writes_nothing(opened):
    mine, theirs = opened(), opened()  # two writers: a Controller and its replacement
    mine.create_session("s1", make_config())
    first = mine.claim_owner("s1")
    mine.append("s1", [msg("a")], owner=first)
    second = theirs.claim_owner("s1")
    assert second > first
    assert theirs.get_meta("s1", "owner") == str(second)
    before = theirs.session("s1")
    for batch in ([msg("b")], [msg("b"), StateChanged(state=AgentState.ERROR)], []):
        with pytest.raises(LeaseLost, match=f"owner {second}, not {first}"):
            mine.append("s1", batch, owner=first)
    assert theirs.session("s1") == before  # not even updated_at moved
    theirs.append("s1", [msg("c")], owner=second)
    assert [e.text for e in assert_consistent(mine, "s1")] == ["a", "c"]
    assert mine.claim_owner("s1") == second + 1


def append_until_fenced(store: EventStore, owner: int, go, fenced) -> None:
    go.wait(10)
    i = 0
    try:
        while True:
            store.append("s1", [msg(f"old:{i}")], owner=owner)
            i += 1
    except LeaseLost:
        fenced.set()


def test_a_claim_fences_a_writer_appending_in_another_process(opened):
    """Whatever instant the claim lands at, nothing of the old owner follows it."""
    store = opened()
    store.create_session("s1", make_config())
    old = store.claim_owner("s1")
    go, fenced = FORK.Event(), FORK.Event()
    child = FORK.Process(target=append_until_fenced, args=(store, old, go, fenced))
    child.start()
    try:
        go.set()
        deadline = time.monotonic() + 10
        while store.last_seq("s1") < 20 and time.monotonic() < deadline:
            time.sleep(0.002)
        new = store.claim_owner("s1")
        [marker] = store.append("s1", [msg("new")], owner=new)
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    assert fenced.is_set() and child.exitcode == 0
    texts = [e.text for e in assert_consistent(store, "s1")]
    assert texts[marker.seq - 1] == "new" and texts[marker.seq:] == []
    assert all(t.startswith("old:") for t in texts[:marker.seq - 1]) and len(texts) > 20


# ---- follow ------------------------------------------------------------------------


def append_slowly(url: str, count: int, go) -> None:
    s = open_store(url)
    go.wait(10)
    for i in range(count):
        s.append("s1", [msg(f"from child {i}")])
        time.sleep(0.01)  # spread the appends over several of the follower's waits
    s.close()


def test_follow_sees_events_another_process_appends(store: EventStore, url: str):
    store.create_session("s1", make_config())
    store.append("s1", [msg("before")])
    go = FORK.Event()
    child = FORK.Process(target=append_slowly, args=(url, 5, go))
    child.start()
    stop = threading.Event()
    seen = []
    try:
        for event in store.follow("s1", timeout_s=20, stop=stop):
            seen.append(event)
            go.set()
            if event.seq == 6:
                stop.set()
                ended_at = time.monotonic()
        assert time.monotonic() - ended_at < 0.5
    finally:
        child.join(20)
    assert child.exitcode == 0
    assert [e.seq for e in seen] == [1, 2, 3, 4, 5, 6]
    assert seen == store.read("s1")


def test_follow_wakes_soon_after_an_append(store: EventStore):
    """A live event reaches a waiting follower in well under the fallback poll."""
    store.create_session("s1", make_config())
    arrived: list[float] = []
    stop = threading.Event()

    def follow() -> None:
        for _ in store.follow("s1", stop=stop):
            arrived.append(time.monotonic())
            stop.set()

    follower = threading.Thread(target=follow)
    follower.start()
    time.sleep(0.3)  # the follower is waiting, not reading its backlog
    sent = time.monotonic()
    store.append("s1", [msg("live")])
    follower.join(5)
    assert not follower.is_alive() and arrived and arrived[0] - sent < 0.5


def test_follow_ends_at_the_deadline(store: EventStore):
    store.create_session("s1", make_config())
    store.append("s1", [msg("a"), msg("b")])
    started = time.monotonic()
    seen = list(store.follow("s1", since=1, timeout_s=0.3, poll_s=0.01))
    elapsed_s = time.monotonic() - started
    assert [e.seq for e in seen] == [2]
    assert 0.3 <= elapsed_s < 1.0


def test_follow_ends_when_stopped_or_when_the_store_closes(opened):
    store, other = opened(), opened()
    store.create_session("s1", make_config())
    stop = threading.Event()
    seen: list = []
    stopped = threading.Thread(target=lambda: seen.extend(store.follow("s1", stop=stop)))
    closed = threading.Thread(target=lambda: seen.extend(other.follow("s1")))
    stopped.start()
    closed.start()
    store.append("s1", [msg("a")])
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(seen) == 2
    stop.set()
    other.close()
    stopped.join(1.0)
    closed.join(1.0)
    assert not stopped.is_alive() and not closed.is_alive()


# ---- concurrency -------------------------------------------------------------------


def append_many(store: EventStore, tag: str, batches: int, go) -> None:
    # the child uses the store object it inherited through fork(): it must reconnect
    go.wait(10)  # all writers start together, so their transactions contend
    for i in range(batches):
        store.append("s1", [msg(f"{tag}:{i}:{j}") for j in range(1 + i % 3)])


def expected_texts(tag: str, batches: int) -> list[str]:
    return [f"{tag}:{i}:{j}" for i in range(batches) for j in range(1 + i % 3)]


def test_processes_appending_to_one_session_keep_seq_gapless_and_unique(store: EventStore):
    store.create_session("s1", make_config())
    store.read("s1")  # the parent holds an open connection across the fork
    tags = ["p0", "p1", "p2"]
    go = FORK.Event()
    procs = [FORK.Process(target=append_many, args=(store, tag, 40, go)) for tag in tags]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    store.append("s1", [msg("parent after the children")])  # its connection survived them
    texts = [e.text for e in assert_consistent(store, "s1")]
    assert len(texts) == len(set(texts)) == 3 * len(expected_texts("p", 40)) + 1
    for tag in tags:  # each writer's events are all there, in its own order
        assert [t for t in texts if t.startswith(f"{tag}:")] == expected_texts(tag, 40)


def test_threads_with_their_own_store_objects_keep_seq_gapless(opened):
    stores = [opened() for _ in range(3)]
    stores[0].create_session("s1", make_config())
    returned: list[list] = [[] for _ in stores]

    def write(n: int) -> None:
        for i in range(30):
            returned[n] += stores[n].append("s1", [msg(f"t{n}:{i}"), msg(f"t{n}:{i}b")])

    threads = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    events = assert_consistent(stores[1], "s1")
    assert len(events) == 180
    assert sorted(e.seq for batch in returned for e in batch) == list(range(1, 181))
    for batch in returned:  # what each append returned is what the log holds
        assert all(events[e.seq - 1] == e for e in batch)
