"""The runtime server's door: a token on every route, checked before any body; loopback
unless TLS or --insecure; the token never in argv; files confined to the workspace."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import pytest

from trouper.config.models import RemoteRuntime
from trouper.exceptions import InvalidRequest
from trouper.runtimes.remote import RemoteSandbox, RemoteUnavailable
from trouper.runtimes.remote_server.serve import (
    ServeError,
    check_listen,
    read_token_file,
)

from accel import forkserver

TOKEN = "t" * 40


@pytest.fixture
def app(tmp_path):
    from trouper.runtimes.remote_server.app import create_app
    from trouper.runtimes.remote_server.registry import Sessions

    sessions = Sessions(tmp_path / "workdir", TOKEN)
    yield create_app(sessions, TOKEN)
    sessions.close()


def routes(app) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, path parameters filled in."""
    found = []
    for route in app.app.routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                found.append((method, re.sub(r"\{[^}]+\}", "x1", route.path)))
    return found


def test_every_route_refuses_a_missing_or_wrong_token(app):
    from starlette.testclient import TestClient

    served = routes(app)
    assert len(served) >= 10, served  # a route added later is checked here too
    with TestClient(app) as client:
        for method, path in served:
            for headers in ({}, {"Authorization": "Bearer " + "u" * 40},
                            {"Authorization": TOKEN}, {"Authorization": f"Bearer {TOKEN}x"}):
                reply = client.request(method, path, headers=headers, json={"epoch": 1})
                assert reply.status_code == 401, (method, path, headers, reply.text)
                assert reply.json()["error"] == "Unauthorized"
                assert reply.headers["connection"] == "close"
        # and the right token opens each of them (so the loop above proves something)
        good = {"Authorization": f"Bearer {TOKEN}"}
        for method, path in served:
            reply = client.request(method, path, headers=good, json={"epoch": 1})
            assert reply.status_code != 401, (method, path, reply.text)
    assert app.refused == 4 * len(served)


def test_errors_are_json_with_a_code(app):
    from starlette.testclient import TestClient

    good = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app) as client:
        missing = client.get("/v1/nowhere", headers=good)
        assert (missing.status_code, missing.json()["error"]) == (404, "NotFound")
        not_running = client.get("/v1/sessions/s1/actions/a1", headers=good)
        assert not_running.json()["error"] == "SandboxNotRunning"
        bad_id = client.post("/v1/sessions/..%2Fx/start", headers=good, json={})
        assert bad_id.status_code in (400, 404)
        not_json = client.post("/v1/sessions/s1/start", headers=good, content=b"{nope")
        assert (not_json.status_code, not_json.json()["error"]) == (400, "BadRequest")
        too_big = client.post("/v1/sessions/s1/start", headers={
            **good, "Content-Length": str(10**12)}, content=b"{}")
        assert too_big.status_code == 413


def test_beyond_loopback_needs_tls_or_insecure():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_listen(host, tls=False, insecure=False)
    for host in ("0.0.0.0", "::", "10.1.2.3"):
        with pytest.raises(ServeError, match="without TLS.*--insecure"):
            check_listen(host, tls=False, insecure=False)
        check_listen(host, tls=True, insecure=False)
        check_listen(host, tls=False, insecure=True)


def test_the_token_file_must_exist_be_private_and_hold_a_token(tmp_path):
    path = tmp_path / "token"
    with pytest.raises(ServeError, match="does not exist"):
        read_token_file(path)
    path.write_text(TOKEN + "\n")
    path.chmod(0o644)
    with pytest.raises(ServeError, match="chmod 600"):
        read_token_file(path)
    path.chmod(0o600)
    assert read_token_file(path) == TOKEN
    path.write_text("short")
    with pytest.raises(ServeError, match="at least"):
        read_token_file(path)


@pytest.mark.slow
def test_the_cli_refuses_0_0_0_0_without_tls_or_insecure(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    result = forkserver.run(  # forked from the suite's zygote: the same entry point
        [sys.executable, "-m", "trouper", "runtime-server", "--host", "0.0.0.0", "--port", "0",
         "--workdir", str(tmp_path / "w"), "--token-file", str(token)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    assert "refusing to listen on 0.0.0.0 without TLS" in result.stderr
    assert "--insecure" in result.stderr and TOKEN not in result.stderr
    assert not (tmp_path / "w").exists()  # refused before anything was made


def _raw(port: int, request: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``request`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


@pytest.mark.slow
def test_a_large_unauthenticated_body_is_refused_unread(remote_server):
    server = remote_server()
    began = time.monotonic()
    # a gigabyte announced, a few bytes sent: an answer (and a close) proves nothing waited
    # for the rest of the body
    head = (b"POST /v1/sessions/s1/actions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{\"a\":")
    reply = _raw(server.port, head)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"Unauthorized" in reply and time.monotonic() - began < 5
    authorized = head.replace(b"Host: x", f"Host: x\r\nAuthorization: Bearer {server.token}"
                              .encode())
    assert _raw(server.port, authorized).startswith(b"HTTP/1.1 413")
    assert server.healthy()


@pytest.mark.slow
def test_uploads_and_downloads_stay_inside_the_workspace(remote_server, tmp_path):
    server = remote_server()
    sandbox = RemoteSandbox("files-1", config=RemoteRuntime(url=server.url, token=server.token))
    sandbox.start()
    workspace = server.workspace("files-1")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("keep out")
    (workspace / "link").symlink_to(outside)
    assert sandbox.upload("sub/data.bin", b"\x00\xffbytes") == 7
    assert (workspace / "sub" / "data.bin").read_bytes() == b"\x00\xffbytes"
    assert sandbox.download("sub/data.bin") == b"\x00\xffbytes"
    escapes = ["../escape.txt", "sub/../../escape.txt", str(outside / "x.txt"),
               "link/x.txt", str(server.token_file)]
    for path in escapes:
        with pytest.raises(InvalidRequest, match="PathRefused"):
            sandbox.upload(path, b"no")
    for path in ["../../token", "link/secret.txt", str(outside / "secret.txt"), "/etc/passwd"]:
        with pytest.raises(InvalidRequest, match="PathRefused"):
            sandbox.download(path)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert not (workspace.parent / "escape.txt").exists()
    assert server.token_file.read_text().strip() == server.token
    sandbox.stop()


@pytest.mark.slow
def test_a_wrong_or_missing_token_fails_the_start_at_once_as_a_misconfiguration(
        remote_server, monkeypatch):
    from trouper.exceptions import RuntimeMisconfigured
    from trouper.messages.causes import RuntimeFailure
    from trouper.runtimes.call_failures import cause_of

    server = remote_server()
    monkeypatch.delenv("TROUPER_RUNTIME_TOKEN", raising=False)
    wrong = RemoteSandbox("s", config=RemoteRuntime(url=server.url, token="w" * 40,
                                                    ready_timeout_s=600))
    with pytest.raises(RuntimeMisconfigured, match="refused the token .*401") as caught:
        wrong.start()  # at once: no wait for the server to answer healthy
    assert cause_of(caught.value) == RuntimeFailure.MISCONFIGURED
    assert caught.value.__cause__.cause == RuntimeFailure.UNAUTHORIZED
    missing = RemoteSandbox("s", config=RemoteRuntime(url=server.url))
    with pytest.raises(RuntimeMisconfigured, match="TROUPER_RUNTIME_TOKEN") as caught:
        missing.start()
    assert cause_of(caught.value) == RuntimeFailure.MISCONFIGURED
    monkeypatch.setenv("MY_TOKEN_VAR", server.token)
    from_env = RemoteSandbox("s", config=RemoteRuntime(url=server.url, token_env="MY_TOKEN_VAR"))
    assert from_env.start() is False
    from_env.stop()


@pytest.mark.slow
def test_an_unreachable_server_is_runtime_unavailable_after_the_ready_wait(tmp_path):
    from trouper.messages.causes import RuntimeFailure

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    sandbox = RemoteSandbox("s", config=RemoteRuntime(url=f"http://127.0.0.1:{port}",
                                                      token=TOKEN, ready_timeout_s=0.5))
    began = time.monotonic()
    with pytest.raises(RemoteUnavailable, match="did not answer healthy within 0.5 s") as caught:
        sandbox.start()
    assert caught.value.cause == RuntimeFailure.UNREACHABLE
    assert time.monotonic() - began < 5
    assert sandbox.running() is False and sandbox.kill() is None
    assert not sandbox.alive().alive


@pytest.mark.slow
def test_tls_serves_https_and_the_client_verifies_it(remote_server, tmp_path):
    import shutil

    from trouper.exceptions import RuntimeMisconfigured

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    server = remote_server("--tls-cert", str(cert), "--tls-key", str(key))
    url = server.url.replace("http://", "https://")
    sandbox = RemoteSandbox("tls-1", config=RemoteRuntime(url=url, token=server.token,
                                                          verify=str(cert)))
    sandbox.start()
    from trouper.messages.actions import RunCommand

    outcome = sandbox.runtime.execute("a", RunCommand(command="echo over-tls"), timeout_s=10,
                                      no_output_timeout_s=5)
    assert outcome.content.strip() == "over-tls"
    unverified = RemoteSandbox("tls-1", config=RemoteRuntime(url=url, token=server.token,
                                                             ready_timeout_s=600))
    with pytest.raises(RuntimeMisconfigured, match="does not trust .*CERTIFICATE_VERIFY"):
        unverified.start()  # at once: no wait mends a certificate
    plain = RemoteSandbox("tls-1", config=RemoteRuntime(url=server.url, token=server.token,
                                                        ready_timeout_s=0.5))
    with pytest.raises(RemoteUnavailable):
        plain.start()
    sandbox.stop()


@pytest.mark.slow
def test_an_endless_header_is_refused_and_the_server_carries_on(remote_server):
    server = remote_server()
    flood = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200_000 + b"\r\n\r\n"
    try:
        reply = _raw(server.port, flood)
    except ConnectionResetError:  # closed before all of it was read: refused too
        reply = b""
    assert not reply.startswith(b"HTTP/1.1 2"), reply[:200]
    assert server.healthy()
