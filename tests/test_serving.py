"""The shared HTTP limits (``trouper/serving``) in milliseconds: the door's counts, the
ASGI size checks called directly, and the protocol's phases on an in-process uvicorn
(a slow app is not a slow client; a body at a fair rate outlives its grace period; a
WebSocket gives its slot back when it closes)."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from trouper.serving.asgi import RequestLimits
from trouper.serving.limits import HttpLimits, Notes
from trouper.serving.protocol import Door, guarded_protocol
from trouper.testing import wait_until


def body_of(status: int, message: str) -> bytes:
    return json.dumps({"error": status, "message": message}).encode()


def test_the_door_counts_per_address_and_in_all():
    door = Door(HttpLimits(max_body_bytes=10, max_connections=3,
                           max_connections_per_client=2), body_of, Notes(_logger()))
    assert door.admit("a") is None and door.admit("a") is None
    assert "from this address" in door.admit("a")
    assert door.admit("b") is None
    assert "3 connections are open" in door.admit("c")
    door.release("a")
    assert door.admit("c") is None and door.count("a") == 1 and door.open == 3
    assert door.refusal.startswith(b"HTTP/1.1 503 ") and b'"error": 503' in door.refusal


def test_notes_log_one_line_a_period_per_kind_and_address(caplog):
    now = [0.0]
    notes = Notes(_logger(), period_s=60, clock=lambda: now[0])
    for _ in range(5):
        notes.note("slow body", "1.2.3.4", "x")
    notes.note("slow body", "5.6.7.8", "x")
    now[0] = 61
    notes.note("slow body", "1.2.3.4", "x")
    lines = [r.getMessage() for r in caplog.records if "slow body" in r.getMessage()]
    assert len(lines) == 3 and "and 4 more" in lines[2] and notes.count == 7


class Recorder:
    """An ASGI app that reads its whole body and answers how much it got."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.called = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called = True
        while True:
            message = await receive()
            self.messages.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"read"})


def call(limits: RequestLimits, headers: list[tuple[bytes, bytes]],
         chunks: list[bytes], kind: str = "http") -> list[dict[str, Any]]:
    """Run one request through ``limits``; what it sent back."""
    sent: list[dict[str, Any]] = []
    queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
             for i, c in enumerate(chunks)]

    async def receive() -> dict[str, Any]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": kind, "method": "POST", "path": "/x", "raw_path": b"/x",
             "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1)}
    asyncio.run(limits(scope, receive, send))
    return sent


def sized(app: Any) -> RequestLimits:
    return RequestLimits(app, max_body_bytes=100, max_header_bytes=1000, error_body=body_of)


@pytest.mark.parametrize("headers,status", [
    ([(b"content-length", b"101")], 413), ([(b"content-length", b"1" * 50)], 413),
    ([(b"content-length", b"-1")], 400), ([(b"content-length", b"5"), (b"content-length",
                                                                      b"6")], 400),
    ([(b"x-pad", b"a" * 1000)], 431)])
def test_a_refusal_from_the_headers_never_reads_the_body(headers, status):
    app = Recorder()
    sent = call(sized(app), headers, [b"x" * 10])
    assert not app.called
    assert sent[0]["status"] == status and (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"] == status


def test_a_chunked_body_is_cut_at_the_limit_and_the_app_told_the_client_left():
    app = Recorder()
    sent = call(sized(app), [], [b"x" * 60, b"x" * 60, b"x" * 60])
    assert [m["type"] for m in app.messages] == ["http.request", "http.disconnect"]
    assert [m.get("status") for m in sent] == [413, None]  # the app's answer went nowhere
    assert call(sized(Recorder()), [], [b"x" * 50, b"x" * 50])[0]["status"] == 200


def test_a_websocket_with_headers_too_large_is_closed_before_the_app():
    app = Recorder()
    sent = call(sized(app), [(b"x-pad", b"a" * 1000)], [], kind="websocket")
    assert sent == [{"type": "websocket.close", "code": 1009, "reason": "headers too large"}]
    assert not app.called


LIMITS = HttpLimits(max_body_bytes=1 << 20, header_timeout_s=0.5, body_timeout_s=0.5,
                    min_body_bytes_per_s=16 * 1024, max_connections=8,
                    max_connections_per_client=8)


async def slow_app(scope: Any, receive: Any, send: Any) -> None:
    """HTTP: read the body, think for 1.5 s (3 header deadlines), answer its size.
    WebSocket: accept, then close when the client does."""
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    await asyncio.sleep(1.5)  # the app's own time: no client deadline runs now
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


@pytest.fixture
def door() -> Iterator[tuple[Door, int]]:
    """An in-process uvicorn behind a door with half-second deadlines; stopped after."""
    door = Door(LIMITS, body_of, Notes(_logger()))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    config = uvicorn.Config(slow_app, log_config=None, lifespan="off",
                            http=guarded_protocol(door), ws="websockets-sansio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "the in-process server")
    try:
        yield door, sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def roundtrip(sock: socket.socket) -> bytes:
    """The head of the answer on ``sock`` (what came before the server closed, if it did)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_a_slow_app_and_a_body_at_a_fair_rate_outlive_the_deadlines(door):
    _, port = door
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n")
        for _ in range(4):  # 1.2 s for 64 KiB: past the 0.5 s grace, at a fair rate
            sock.sendall(b"x" * 16384)
            time.sleep(0.3)  # the client's pace, not a wait for a condition
        assert roundtrip(sock).startswith(b"HTTP/1.1 200")


def test_a_websocket_gives_its_slot_back_when_it_closes(door):
    door_, port = door
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                 b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"\r\n")
    assert sock.recv(65536).startswith(b"HTTP/1.1 101")
    # twice the header deadline passes and the server neither closes nor sends anything
    assert select.select([sock], [], [], LIMITS.header_timeout_s * 2)[0] == []
    assert door_.open == 1
    sock.close()
    wait_until(lambda: door_.open == 0, 10, "the WebSocket's slot given back")


def _logger() -> Any:
    import logging

    return logging.getLogger("test.serving")


def test_malformed_http_is_answered_400_in_the_servers_json_shape(door):
    _, port = door
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):  # it closes once answered
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert json.loads(body)["error"] == 400
