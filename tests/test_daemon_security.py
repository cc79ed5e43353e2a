"""Who may drive the daemon: the token on every route (found by walking the app's routes,
so a route added without the guard fails here), the daemon's own Host and Origin only,
and a token kept owner-only, never in a command line or a log."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from trouper.daemon.app import create_app
from trouper.daemon.auth import PUBLIC_PATHS, allowed_hosts
from trouper.host.processes import children_of
from trouper.security.tls import default_ssl_context
from trouper.testing.daemon import running_daemon

pytestmark = pytest.mark.slow  # starts a daemon process

FINISH = {"tool": "finish", "args": {"message": "done"}}


@pytest.fixture(scope="module")
def http():
    """One client for the plain requests (closed at the module's end)."""
    with httpx.Client(verify=default_ssl_context(), trust_env=False) as client:
        yield client


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    # started afresh, not forked: the argv and environment tests read its own in /proc
    with running_daemon(tmp_path_factory.mktemp("shome"), popen=subprocess.Popen) as d:
        yield d


@pytest.fixture(scope="module")
def session_id(daemon):
    from trouper.testing import FakeLLMServer, load_script

    server = FakeLLMServer(load_script([FINISH])).start()
    try:
        llm = {"model": "hosted_vllm/scripted", "base_url": server.url, "api_key": "test-key"}
        made = daemon.http().post("/v1/sessions", json={"task": "t", "llm": llm})
        assert made.status_code == 201
        sid = made.json()["id"]
        daemon.client().session(sid).wait(timeout=60)
        yield sid
    finally:
        server.stop()


def every_route(session_id: str) -> list[tuple[str, str]]:
    """(method or "WS", path) for each route of the app, path parameters filled in."""
    app = create_app(None, token="x", hosts=allowed_hosts("127.0.0.1", 1))  # type: ignore[arg-type]
    found = []
    for route in app.fastapi.routes:
        path = route.path.replace("{session_id}", session_id)
        methods = getattr(route, "methods", None)
        if methods is None:
            found.append(("WS", path))
        else:
            found += [(m, path) for m in sorted(methods) if m != "HEAD"]
    assert len(found) >= 16, found
    return found


def ws_status(url: str, headers: dict[str, str] | None = None,
              subprotocols: list[str] | None = None) -> int:
    """The handshake's HTTP status (101 when the WebSocket opened)."""
    async def attempt() -> int:
        try:
            async with ws_connect(url, additional_headers=headers or {},
                                  subprotocols=subprotocols, open_timeout=10):  # type: ignore[arg-type]
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code
    return asyncio.run(attempt())


@pytest.mark.parametrize("token", [None, "wrong-token", "Basic"])
def test_every_route_refuses_a_request_without_the_right_token(daemon, session_id, token,
                                                              http):
    headers = ({} if token is None else {"Authorization": "Basic dXNlcjpwYXNz"}
               if token == "Basic" else {"Authorization": f"Bearer {token}"})
    refused = []
    for method, path in every_route(session_id):
        if method == "WS":
            status = ws_status(daemon.url.replace("http", "ws") + path, headers)
        else:
            answer = http.request(method, daemon.url + path, headers=headers, json={},
                                   timeout=10)
            status = answer.status_code
            if path in PUBLIC_PATHS:
                assert status == 200 and daemon.token not in answer.text
                continue
            assert answer.json()["error"]["code"] == "unauthorized"
        refused.append((method, path, status))
    assert refused and all(status == 401 for _, _, status in refused), refused


def test_the_right_token_opens_every_route(daemon, session_id):
    for method, path in every_route(session_id):
        if method == "WS":
            status = ws_status(daemon.url.replace("http", "ws") + path + "?until_settled=true",
                               {"Authorization": f"Bearer {daemon.token}"})
            assert status == 101
            status = ws_status(daemon.url.replace("http", "ws") + path + "?until_settled=true",
                               subprotocols=["trouper.v1", f"bearer.{daemon.token}"])
            assert status == 101
        elif method == "GET":
            answer = daemon.http().get(path, params={"until_settled": True})
            assert answer.status_code == 200, (path, answer.text)


def test_a_foreign_host_or_origin_is_refused(daemon, session_id):
    http = daemon.http()
    port = daemon.port
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", ""):
        for path in ("/v1/health", "/"):
            answer = http.get(path, headers={"Host": host})
            assert answer.status_code == 403, (host, path)
            assert answer.json()["error"]["code"] == "forbidden_host"
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null",
                   f"https://127.0.0.1:{port}"):
        answer = http.post(f"/v1/sessions/{session_id}/stop", headers={"Origin": origin})
        assert answer.status_code == 403, origin
        assert answer.json()["error"]["code"] == "forbidden_origin"
        ws = daemon.url.replace("http", "ws") + f"/v1/sessions/{session_id}/events/ws"
        assert ws_status(ws, {"Authorization": f"Bearer {daemon.token}",
                              "Origin": origin}) == 403
    for own in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
        assert http.get("/v1/health", headers={"Origin": own}).status_code == 200
    assert http.get("/v1/health", headers={"Host": f"localhost:{port}"}).status_code == 200


def test_the_token_is_owner_only_and_never_in_argv_or_logs(daemon, session_id, http):
    for path in (daemon.files.token, daemon.files.info, daemon.files.pid):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    token = daemon.token.encode()
    assert len(token) >= 32
    for pid in [daemon.pid, *children_of(daemon.pid)]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                assert token not in cmdline.read()
            with open(f"/proc/{pid}/environ", "rb") as environ:
                assert token not in environ.read()
        except (FileNotFoundError, ProcessLookupError):  # it exited since it was listed
            continue
    http.get(daemon.url + "/v1/health", headers={"Authorization": "Bearer wrong"})
    for log in (daemon.home.root / "logs").iterdir():
        assert token not in log.read_bytes(), log
    page = http.get(daemon.url + "/")
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert page.headers["x-frame-options"] == "DENY"


def test_a_second_token_file_is_never_made_and_the_page_needs_none(daemon, http):
    before = daemon.files.token.read_text()
    for path in PUBLIC_PATHS:
        answer = http.get(daemon.url + path)
        assert answer.status_code == 200 and before.strip() not in answer.text
    assert daemon.files.token.read_text() == before


def test_no_proxy_from_the_environment_ever_sees_the_token(daemon, monkeypatch):
    """HTTP_PROXY set and no NO_PROXY: the client and the health check still go straight
    to the daemon; a listener standing in for the proxy is never even connected to."""
    import socket

    from trouper.client.daemon import RemoteTrouper
    from trouper.daemon.process import health

    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(8)
    trap.setblocking(False)
    proxy = f"http://127.0.0.1:{trap.getsockname()[1]}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    try:
        with RemoteTrouper(daemon.url, daemon.token, timeout_s=5) as client:
            assert client.health()["pid"] == daemon.pid
            assert isinstance(client.sessions(), list)
        assert health(daemon.url, daemon.token, timeout_s=5)
        with pytest.raises(BlockingIOError):
            trap.accept()  # nothing ever connected to the "proxy"
    finally:
        trap.close()
