"""The live streams, from a real daemon process: a client that drops and reconnects from
the last seq it got, again and again while the session keeps appending, sees every event
exactly once and in order, over SSE (Last-Event-ID) and over a WebSocket (?after=)."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect as ws_connect

from trouper.client.daemon import parse_sse
from trouper.testing import wait_until
from trouper.testing.daemon import running_daemon

pytestmark = pytest.mark.slow  # starts a daemon process

FINISH = {"tool": "finish", "args": {"message": "done"}}
STEPS = [{"tool": "run", "args": {"command": f"echo step {i}"}, "delay_s": 0.05}
         for i in range(40)] + [FINISH]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with running_daemon(tmp_path_factory.mktemp("sthome")) as d:
        yield d


def start(daemon, scripted) -> str:
    _, llm = scripted(STEPS)
    made = daemon.http().post("/v1/sessions", json={"task": "count", "llm": llm,
                                                   "max_iterations": 100})
    assert made.status_code == 201
    return made.json()["id"]


def the_log(daemon, sid) -> list[dict]:
    return daemon.http().get(f"/v1/sessions/{sid}/events", params={"limit": 5000}
                             ).json()["events"]


def head(daemon, sid) -> int:
    return daemon.http().get(f"/v1/sessions/{sid}/events", params={"limit": 1}
                             ).json()["head_seq"]


def test_sse_reconnects_from_last_event_id_with_no_gap_and_no_duplicate(daemon, scripted):
    sid = start(daemon, scripted)
    http = daemon.http()
    got: list[dict] = []
    live_reconnects, end = 0, None
    while end is None:
        headers = {"Last-Event-ID": str(got[-1]["seq"])} if got else {}
        before = head(daemon, sid)
        # ?after=0 is overridden by Last-Event-ID, as a browser's reconnect sends both
        with http.stream("GET", f"/v1/sessions/{sid}/events/stream",
                         params={"after": 0, "until_settled": True}, headers=headers) as s:
            assert s.status_code == 200
            for kind, data in parse_sse(s.iter_lines()):
                if kind == "end":
                    end = data
                    break
                if kind == "comment":
                    continue
                got.append(data)
                if len(got) % 7 == 0:  # drop the connection mid-stream
                    break
        if end is None and head(daemon, sid) > before:
            live_reconnects += 1
    seqs = [e["seq"] for e in got]
    assert seqs == list(range(1, len(seqs) + 1))
    assert end["reason"] == "settled" and end["after"] == seqs[-1]
    assert got == the_log(daemon, sid)
    assert live_reconnects >= 3  # the log grew while the client was away


def test_websocket_reconnects_from_after_with_no_gap_and_no_duplicate(daemon, scripted):
    sid = start(daemon, scripted)
    base = daemon.url.replace("http", "ws") + f"/v1/sessions/{sid}/events/ws"
    auth = {"Authorization": f"Bearer {daemon.token}"}

    async def read_some(after: int) -> tuple[list[dict], dict | None, int | None]:
        got, end = [], None
        # max_queue=None: a client that stops reading with more than max_queue frames
        # unread stops reading its socket, and so waits close_timeout (10 s) for the
        # server's close reply queued behind them (seen under load)
        async with ws_connect(f"{base}?after={after}&until_settled=true",
                              additional_headers=auth, max_queue=None) as ws:
            async for raw in ws:
                message = json.loads(raw)
                if message["type"] == "end":
                    end = message
                    break
                if message["type"] == "event":
                    assert message["seq"] == message["event"]["seq"]
                    got.append(message["event"])
                    if len(got) == 5:
                        break
            if end is not None:
                await ws.wait_closed()
            return got, end, ws.close_code if end is not None else None

    got: list[dict] = []
    end, code, live = None, None, 0
    while end is None:
        before = head(daemon, sid)
        more, end, code = asyncio.run(read_some(got[-1]["seq"] if got else 0))
        got += more
        live += end is None and head(daemon, sid) > before
    seqs = [e["seq"] for e in got]
    assert seqs == list(range(1, len(seqs) + 1))
    assert end["reason"] == "settled" and end["after"] == seqs[-1] and code == 1000
    assert got == the_log(daemon, sid)
    assert live >= 3


def test_a_client_that_goes_away_changes_nothing(daemon, scripted):
    sid = start(daemon, scripted)
    http = daemon.http()
    for _ in range(3):
        with http.stream("GET", f"/v1/sessions/{sid}/events/stream") as s:
            next(s.iter_lines())
    client = daemon.client()
    assert client.session(sid).wait(timeout=120).value == "finished"
    assert http.get("/v1/health").json()["streams"] == 0


def test_a_client_that_stops_reading_is_closed_with_the_seq_to_resume_from(tmp_path):
    """Over a real socket: a client that reads nothing while ~20 MB wait fills the TCP
    buffers, then the daemon's; it is closed with ``end`` (overflow) and the seq to resume
    from, and resuming from there gets the rest: nothing dropped, nothing twice."""
    from trouper.config.models import LLMConfig, SessionConfig
    from trouper.messages.events import AgentState, MessageEvent, StateChanged
    from trouper.store import open_store

    env = {"TROUPER_DAEMON_STREAM_BUFFER": "8", "TROUPER_DAEMON_SLOW_CLIENT_S": "0.5"}
    with running_daemon(tmp_path / "home", env=env) as daemon:
        store = open_store(daemon.home)
        try:
            config = SessionConfig(task="big", llm=LLMConfig(model="m"),
                                   workspace=str(tmp_path))
            store.create_session("s-big", config)
            for start in range(0, 2000, 200):
                store.append("s-big", [MessageEvent(source="agent", text=f"{i} " + "x" * 10_000)
                                       for i in range(start, start + 200)])
            store.append("s-big", [StateChanged(state=AgentState.FINISHED)])
        finally:
            store.close()
        http = daemon.http()
        got, ends = [], []
        with http.stream("GET", "/v1/sessions/s-big/events/stream") as s:
            lines = s.iter_lines()
            next(lines)
            # not reading, until the daemon has given up on this client
            wait_until(lambda: "s-big: the client did not keep up" in
                       daemon.files.log.read_text(), 60, "the daemon closing the stream")
            for kind, data in parse_sse(lines):
                if kind == "message":
                    got.append(data["seq"])
                elif kind == "end":
                    ends.append(data)
                    break
        assert ends and ends[0]["reason"] == "overflow"
        assert ends[0]["after"] == got[-1] < 2001
        rest, end = [], None
        with http.stream("GET", "/v1/sessions/s-big/events/stream",
                         params={"until_settled": True},
                         headers={"Last-Event-ID": str(ends[0]["after"])}) as s:
            for kind, data in parse_sse(s.iter_lines()):
                if kind == "message":
                    rest.append(data["seq"])
                elif kind == "end":
                    end = data
                    break
        assert end["reason"] == "settled"
        assert got + rest == list(range(1, 2002))
        assert http.get("/v1/health").json()["streams"] == 0
