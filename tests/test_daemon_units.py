"""The daemon's pieces in one process, quickly: a slow stream client is closed with the
seq to resume from (never dropped silently), the guard's checks, SSE parsing, the
home's lock, and the store's pages."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from trouper.client.daemon import parse_sse
from trouper.daemon.auth import Guard, allowed_hosts
from trouper.daemon.files import DaemonFiles, HomeLock, ensure_token, lock_is_held, read_token
from trouper.daemon.stream import HEARTBEAT, End, StreamLimits, Streams
from trouper.home.paths import Home
from trouper.messages.events import MessageEvent


class FakeSession:
    """Yields ``n`` events after ``since``, then waits until stopped (a live session)."""

    id = "s-fake"

    def __init__(self, n: int) -> None:
        self.n = n

    def events(self, since: int, *, follow: bool, until_settled: bool,
               stop: threading.Event) -> Iterator[MessageEvent]:
        for seq in range(since + 1, self.n + 1):
            if stop.is_set():
                return
            yield MessageEvent(seq=seq, text=f"event {seq}")
        if not until_settled:
            stop.wait()


def test_a_slow_client_is_closed_with_the_seq_to_resume_from():
    async def scenario() -> tuple[list[int], End]:
        streams = Streams(StreamLimits(max_streams=5, buffer=10, slow_client_s=0.2,
                                       heartbeat_s=5))
        sub = streams.subscribe(FakeSession(100), 0, False, asyncio.get_running_loop())
        assert sub is not None
        await asyncio.to_thread(sub._thread.join, 10)  # the client reads nothing meanwhile
        seqs = []
        while True:
            item = await sub.next(1.0)
            if isinstance(item, End):
                sub.close()
                return seqs, item
            seqs.append(item.seq)  # type: ignore[union-attr]

    seqs, end = asyncio.run(scenario())
    assert seqs == list(range(1, 11))  # the buffer's worth, then the close
    assert end.reason == "overflow" and end.after == 10
    assert "reconnect from seq 10" in end.message


def test_a_client_that_keeps_up_gets_everything_and_heartbeats():
    async def scenario() -> tuple[list[int], bool, int]:
        streams = Streams(StreamLimits(max_streams=1, buffer=4, slow_client_s=30,
                                       heartbeat_s=0.05))
        sub = streams.subscribe(FakeSession(50), 20, False, asyncio.get_running_loop())
        assert sub is not None
        assert streams.subscribe(FakeSession(1), 0, False, asyncio.get_running_loop()) is None
        seqs = []
        while len(seqs) < 30:
            item = await sub.next(5.0)
            assert not isinstance(item, End), item
            if item is not HEARTBEAT:
                seqs.append(item.seq)  # type: ignore[union-attr]
        beat = await sub.next(0.05) is HEARTBEAT  # nothing more comes: a heartbeat
        streams.close_all()
        end = await sub.next(5.0)
        sub.close()
        assert isinstance(end, End) and end.reason == "closing"
        return seqs, beat, streams.count

    seqs, beat, left = asyncio.run(scenario())
    assert seqs == list(range(21, 51)) and beat and left == 0


def guarded_client(hosts=None) -> TestClient:
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = Guard(app, token="t0ken", hosts=hosts or allowed_hosts("127.0.0.1", 8000))
    return TestClient(guard, base_url="http://127.0.0.1:8000")


@pytest.mark.parametrize("headers,status", [
    ({}, 401),
    ({"Authorization": "Bearer t0ken"}, 200),
    ({"Authorization": "bearer t0ken"}, 200),
    ({"Authorization": "Bearer t0ken2"}, 401),
    ({"Authorization": "Bearer t0ke"}, 401),
    ({"Authorization": "Bearer t0ken", "Host": "localhost:8000"}, 200),
    ({"Authorization": "Bearer t0ken", "Host": "[::1]:8000"}, 200),
    ({"Authorization": "Bearer t0ken", "Host": "attacker.test:8000"}, 403),
    ({"Authorization": "Bearer t0ken", "Host": "127.0.0.1"}, 403),
    ({"Authorization": "Bearer t0ken", "Origin": "http://127.0.0.1:8000"}, 200),
    ({"Authorization": "Bearer t0ken", "Origin": "http://attacker.test"}, 403),
    ({"Authorization": "Bearer t0ken", "Origin": "null"}, 403),
])
def test_the_guard(headers, status):
    with guarded_client() as client:
        assert client.get("/v1/health", headers=headers).status_code == status


def test_the_guard_serves_only_the_page_without_the_token():
    with guarded_client() as client:
        assert client.get("/").status_code == 200
        assert client.get("/page/app.js").status_code == 200
        assert client.get("/page/../v1/health").status_code == 401
        assert client.get("/?token=t0ken").status_code == 200  # the page, no more
        assert client.get("/v1/health?token=t0ken").status_code == 401  # never a query


def test_a_daemon_on_another_host_accepts_that_host_too():
    with guarded_client(allowed_hosts("10.1.2.3", 9)) as client:
        answer = client.get("/v1/health", headers={"Authorization": "Bearer t0ken",
                                                   "Host": "10.1.2.3:9"})
        assert answer.status_code == 200


def test_sse_parsing():
    lines = ["retry: 1000", ": a comment", "", "id: 3", 'data: {"seq": 3}', "",
             "event: end", 'data: {"type": "end",', 'data: "after": 3}', ""]
    assert list(parse_sse(iter(lines))) == [("comment", {}), ("message", {"seq": 3}),
                                            ("end", {"type": "end", "after": 3})]


def test_the_token_is_made_once_owner_only(tmp_path):
    files = DaemonFiles(Home.at(tmp_path / "home"))
    assert read_token(files) is None
    token = ensure_token(files)
    assert ensure_token(files) == token == read_token(files)
    assert stat.S_IMODE(os.stat(files.token).st_mode) == 0o600
    os.chmod(files.token, 0o644)
    assert read_token(files) == token
    assert stat.S_IMODE(os.stat(files.token).st_mode) == 0o600


def test_the_home_lock_is_one_holder_and_free_when_released(tmp_path):
    files = DaemonFiles(Home.at(tmp_path / "home"))
    assert not lock_is_held(files)
    first = HomeLock(files)
    assert first.acquire()
    # another process asks: held (lockf locks belong to a process, so ask from another)
    probe = ("import sys; from trouper.daemon.files import DaemonFiles, HomeLock, "
             "lock_is_held; from trouper.home.paths import Home; "
             "f = DaemonFiles(Home.at(sys.argv[1]));"
             " print(lock_is_held(f), HomeLock(f).acquire())")
    import sys

    from accel import forkserver

    def ask() -> str:  # forked from the suite's zygote: a process of its own, imports paid
        return forkserver.run([sys.executable, "-c", probe, str(tmp_path / "home")],
                              capture_output=True, text=True, timeout=60).stdout.strip()

    assert ask() == "True False"
    first.release()
    assert ask() == "False True"


def test_allowed_hosts_from_the_environment(monkeypatch):
    from trouper.daemon.server import _hosts

    monkeypatch.setenv("TROUPER_DAEMON_ALLOWED_HOSTS", "box.lan, 192.168.1.5:80,[fe80::1]")
    hosts = _hosts("0.0.0.0", 7700)
    assert {"box.lan:7700", "192.168.1.5:80", "[fe80::1]:7700", "0.0.0.0:7700",
            "127.0.0.1:7700", "localhost:7700", "[::1]:7700"} == hosts
