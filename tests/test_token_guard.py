"""The door both HTTP servers share (``serving/token_guard.py``), driven as plain ASGI: the
token checked in constant time from the headers, a refusal answered without reading the
body and with ``Connection: close``, each server's own error shape, and one log line a
minute per address."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from trouper.daemon.auth import Guard as DaemonGuard
from trouper.daemon.auth import allowed_hosts
from trouper.runtimes.remote_server.guard import Guard as RuntimeServerGuard
from trouper.serving.limits import Notes
from trouper.serving.token_guard import Refusal, TokenGuard

TOKEN = "s3cret-token-0123456789"


class Inner:
    """The app behind the door: records who reached it, answers 200."""

    def __init__(self) -> None:
        self.reached: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached.append(scope["type"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})


async def _never_read() -> dict[str, Any]:
    raise AssertionError("the guard read the body of a request it refused")


def call(guard: Any, headers: dict[str, str] | list[tuple[str, str]] | None = None, *,
         kind: str = "http", path: str = "/v1/x", client: str = "10.0.0.1",
         subprotocols: list[str] | None = None) -> tuple[int | None, dict[str, str], bytes]:
    """One request through ``guard``: its status, headers and body (None: a close)."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    scope = {"type": kind, "path": path, "method": "POST" if kind == "http" else None,
             "client": (client, 5000), "subprotocols": subprotocols or [],
             "headers": [(n.lower().encode(), v.encode()) for n, v in
                         [*pairs, ("content-length", str(10**12))]]}
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(scope, _never_read, send))
    start = next((m for m in sent if m["type"].endswith("response.start")), None)
    if start is None:
        return None, {}, b""
    body = b"".join(m.get("body", b"") for m in sent if m["type"].endswith("response.body"))
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def render(refusal: Refusal) -> bytes:
    return json.dumps({"why": refusal.kind}).encode()


def plain_guard(inner: Inner, **options: Any) -> TokenGuard:
    return TokenGuard(inner, token=TOKEN, render=render, **options)


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": f"Bearer {TOKEN[:-1]}"},
    {"Authorization": TOKEN}, {"Authorization": "Basic dXNlcjpwYXNz"},
    {"Authorization": "Bearer "}, [("Authorization", f"Bearer {TOKEN}")] * 2,
])
def test_a_missing_or_wrong_token_is_refused_unread_with_a_close(headers):
    inner = Inner()
    guard = plain_guard(inner)
    status, answer_headers, body = call(guard, headers)
    assert status == 401 and inner.reached == []
    assert answer_headers["connection"] == "close"
    assert answer_headers["www-authenticate"].startswith("Bearer")
    assert json.loads(body) == {"why": "unauthorized"}
    assert answer_headers["content-length"] == str(len(body))
    assert guard.refused == 1


@pytest.mark.parametrize("value", [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"Bearer  {TOKEN} "])
def test_the_right_token_goes_through(value):
    inner = Inner()
    assert call(plain_guard(inner), {"Authorization": value})[0] == 200
    assert inner.reached == ["http"]


def test_an_empty_token_is_refused_at_construction():
    with pytest.raises(ValueError, match="empty"):
        TokenGuard(Inner(), token="", render=render)


def test_a_websocket_may_offer_the_token_as_a_subprotocol_where_the_server_allows_it():
    inner = Inner()
    guard = plain_guard(inner, subprotocol_prefix="bearer.")
    assert call(guard, kind="websocket", subprotocols=["v1", f"bearer.{TOKEN}"])[0] is None
    assert inner.reached == ["websocket"]
    assert call(guard, kind="websocket", subprotocols=["bearer.nope"])[0] is None
    assert inner.reached == ["websocket"] and guard.refused == 1  # closed, not let in
    no_prefix = plain_guard(inner)
    call(no_prefix, kind="websocket", subprotocols=[f"bearer.{TOKEN}"])
    assert no_prefix.refused == 1


def test_a_server_without_websockets_closes_every_handshake():
    inner = Inner()
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/", "headers": [
        (b"authorization", f"Bearer {TOKEN}".encode())]}
    asyncio.run(plain_guard(inner, websockets=False)(scope, _never_read, send))
    assert sent == [{"type": "websocket.close", "code": 1008}] and inner.reached == []


def test_a_servers_own_checks_come_first_and_public_paths_need_no_token():
    inner = Inner()

    def no_teapots(scope: Any, headers: dict[str, str]) -> Refusal | None:
        return Refusal(418, "teapot", "no") if headers.get("origin") == "tea" else None

    guard = plain_guard(inner, before=[no_teapots], public_paths={"/page"})
    right = {"Authorization": f"Bearer {TOKEN}"}
    status, headers, body = call(guard, {**right, "Origin": "tea"})
    assert (status, json.loads(body), headers["connection"]) == (418, {"why": "teapot"}, "close")
    assert "www-authenticate" not in headers
    assert call(guard, {}, path="/page")[0] == 200
    assert call(guard, {"Origin": "tea"}, path="/page")[0] == 418
    assert call(guard, {}, path="/page/x")[0] == 401


def test_refusals_are_logged_once_a_minute_per_address(caplog):
    now = [0.0]
    notes = Notes(logging.getLogger("test.guard"), clock=lambda: now[0])
    guard = plain_guard(Inner(), notes=notes)
    with caplog.at_level(logging.WARNING, logger="test.guard"):
        for _ in range(5):
            call(guard, {}, client="10.0.0.1")
        call(guard, {}, client="10.0.0.2")
        now[0] = 61.0
        call(guard, {}, client="10.0.0.1")
    lines = [r.getMessage() for r in caplog.records if r.name == "test.guard"]
    assert len(lines) == 3 and guard.refused == 7
    assert lines[0].startswith("unauthorized request from 10.0.0.1: POST /v1/x: 401")
    assert "10.0.0.2" in lines[1] and "and 4 more" in lines[2]
    assert TOKEN not in " ".join(lines)


def test_each_server_keeps_its_error_shape_behind_the_one_door():
    daemon = DaemonGuard(Inner(), token=TOKEN, hosts=allowed_hosts("127.0.0.1", 8000))
    runtime_server = RuntimeServerGuard(Inner(), TOKEN, max_body_bytes=1000)
    assert isinstance(daemon, TokenGuard) and isinstance(runtime_server, TokenGuard)
    status, headers, body = call(daemon, {"Host": "127.0.0.1:8000"})
    assert (status, headers["connection"]) == (401, "close")
    assert json.loads(body)["error"]["code"] == "unauthorized"
    status, headers, body = call(runtime_server, {"Host": "anything"})
    assert (status, headers["connection"]) == (401, "close")
    assert json.loads(body)["error"] == "Unauthorized" and json.loads(body)["message"]
    status, _, body = call(daemon, {"Host": "evil:8000", "Authorization": f"Bearer {TOKEN}"})
    assert (status, json.loads(body)["error"]["code"]) == (403, "forbidden_host")
    right = {"Authorization": f"Bearer {TOKEN}"}
    assert call(daemon, {**right, "Host": "localhost:8000"})[0] == 200
    # the runtime server's sizes come after the token: a right token meets the body limit
    status, _, body = call(runtime_server, right)
    assert (status, json.loads(body)["error"]) == (413, "PayloadTooLarge")
