"""The PostgreSQL store's followers share one LISTENing connection per store and process
(store/postgres_listen.py): its count, its reconnection, its end at close(), and a forked
child's own."""

from __future__ import annotations

import threading

import psycopg
import pytest
from test_store_postgres import FORK, connections_of, make_config, msg

from trouper.store import PostgresEventStore
from trouper.store import postgres as postgres_store
from trouper.testing import wait_until

# ---- one listening connection for every follower ---------------------------------------


def listeners_of(url: str) -> list[int]:
    """The server pids of the store's listening connections on the test's database."""
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'trouper-listen'")]


class Followers:
    """A thread per session id, each following it until it has seen ``want`` events or
    its follow ends (the store closed)."""

    def __init__(self, store: PostgresEventStore, session_ids: list[str], want: int) -> None:
        self.session_ids = session_ids
        self.seen: list[list[str]] = [[] for _ in session_ids]
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._follow, args=(store, n, want))
                        for n in range(len(session_ids))]
        for t in self.threads:
            t.start()

    def _follow(self, store: PostgresEventStore, n: int, want: int) -> None:
        events = store.follow(self.session_ids[n])
        try:
            for event in events:
                self.seen[n].append(event.text)
                if len(self.seen[n]) == want:
                    return
        except BaseException as e:  # noqa: BLE001 - the test reads it
            self.errors.append(e)
        finally:
            events.close()

    def have_seen(self, count: int) -> bool:
        return all(len(seen) >= count for seen in self.seen)

    def join(self) -> None:
        for t in self.threads:
            t.join(30)  # a guard against a hang, not a bound under test
        assert not any(t.is_alive() for t in self.threads) and self.errors == []


@pytest.fixture
def notices_only(monkeypatch) -> None:
    """Followers read only when the listener wakes them (no fallback poll to hide a
    notice that never reached them)."""
    monkeypatch.setattr(postgres_store, "_FALLBACK_POLL_S", 3600.0)


def test_fifty_followers_share_one_listening_connection(postgres_url: str, notices_only):
    store = PostgresEventStore(postgres_url, pool_size=4)
    own = [f"s{n}" for n in range(25)]
    ids = ["shared"] * 25 + own
    try:
        for sid in ["shared", *own]:
            store.create_session(sid, make_config())
        followers = Followers(store, ids, want=2)
        for sid in ["shared", *own]:
            store.append(sid, [msg(f"first {sid}")])
        wait_until(lambda: followers.have_seen(1), 30, "every follower's first event")
        assert store.listener().watchers == 50  # every one still follows
        assert len(listeners_of(postgres_url)) == 1
        assert connections_of(postgres_url) <= 4 + 1  # the pool and the listener
        for sid in ["shared", *own]:
            store.append(sid, [msg(f"second {sid}")])
        followers.join()
        assert followers.seen == [[f"first {sid}", f"second {sid}"] for sid in ids]
        wait_until(lambda: listeners_of(postgres_url) == [], 10,
                   "the listener to stop with the last follower")
    finally:
        store.close()


def test_followers_carry_on_when_the_listening_connection_is_killed(
        postgres_url: str, notices_only):
    store = PostgresEventStore(postgres_url)
    try:
        for sid in ("s1", "s2"):
            store.create_session(sid, make_config())
            store.append(sid, [msg(f"before {sid}")])
        followers = Followers(store, ["s1", "s1", "s2"], want=2)
        wait_until(lambda: followers.have_seen(1) and len(listeners_of(postgres_url)) == 1,
                   what="the followers and their listener")
        [old] = listeners_of(postgres_url)
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (old,)).fetchone()[0]
        wait_until(lambda: [p for p in listeners_of(postgres_url) if p != old] != [], 30,
                   "the listener to reconnect")
        for sid in ("s1", "s2"):
            store.append(sid, [msg(f"after {sid}")])
        followers.join()
        assert followers.seen == [["before s1", "after s1"]] * 2 + [["before s2", "after s2"]]
    finally:
        store.close()


def test_close_ends_waiting_followers_and_the_listener(postgres_url: str, notices_only):
    store = PostgresEventStore(postgres_url)
    store.create_session("s1", make_config())
    store.append("s1", [msg("a")])
    followers = Followers(store, ["s1"] * 3, want=10**6)
    held = store.follow("s1")  # a follower whose reader is busy elsewhere: not waiting
    assert next(held).text == "a"
    wait_until(lambda: followers.have_seen(1) and len(listeners_of(postgres_url)) == 1,
               what="the followers and their listener")
    listener = store.listener()
    store.close()
    assert not listener.running  # close() ended the listening thread, not the last follower
    followers.join()
    assert list(held) == []
    wait_until(lambda: connections_of(postgres_url) == 0, 10, "every connection to close")


def follow_in_child(store: PostgresEventStore) -> None:
    """On the store object a forked child inherited: the second event reaches it only
    through a listener of the child's own (the test allows no fallback poll)."""
    seen: list[str] = []
    events = store.follow("s1", timeout_s=60)  # the deadline guards against a hang
    for event in events:
        seen.append(event.text)
        if event.text == "second":
            break
    events.close()
    store.close()
    if seen != ["first", "second"]:
        raise SystemExit(f"the child saw {seen}")


def test_a_forked_child_follows_on_a_listener_of_its_own(postgres_url: str, notices_only):
    store = PostgresEventStore(postgres_url)
    try:
        store.create_session("s1", make_config())
        store.append("s1", [msg("first")])
        followers = Followers(store, ["s1"], want=2)
        wait_until(lambda: followers.have_seen(1) and len(listeners_of(postgres_url)) == 1,
                   what="the parent's follower and listener")
        child = FORK.Process(target=follow_in_child, args=(store,))
        child.start()
        try:
            wait_until(lambda: len(listeners_of(postgres_url)) == 2, 30,
                       "the child's own listener")
            store.append("s1", [msg("second")])
            followers.join()
        finally:
            child.join(60)
        assert child.exitcode == 0
        assert followers.seen == [["first", "second"]]
    finally:
        store.close()
