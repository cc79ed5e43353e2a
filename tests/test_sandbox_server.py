"""What a client that is not trouper can cost the sandbox server: nothing lasting.

Real servers on 127.0.0.1, spoken to over raw sockets: an unauthenticated 100 MB body,
slow and trickling headers, oversized and malformed bodies, too many connections.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trouper.host.processes import pid_alive
from trouper.messages.actions import WriteFile
from trouper.runtimes import sandbox_client as client_module
from trouper.runtimes.launch import BOOT as _BOOT
from trouper.runtimes.launch import RUNTIMES_DIR
from trouper.runtimes.local import LocalSandbox
from trouper.runtimes.sandbox import MAX_BODY_BYTES
from trouper.runtimes.sandbox_client import SandboxClient
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

MB = 1024 * 1024


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    token: str
    log: Path

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def client(self) -> SandboxClient:
        return SandboxClient("127.0.0.1", self.port, self.token, None)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _read_info(state: Path) -> dict | None:
    try:
        return json.loads((state / "server.json").read_text())
    except (OSError, ValueError):
        return None


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start sandbox servers with extra options; each is stopped, shell included."""
    started: list[tuple[subprocess.Popen[bytes], int]] = []

    def start(*options: str) -> Server:
        state = tmp_path / f"state{len(started)}"
        state.mkdir()
        log = state / "server.log"
        command = [sys.executable, "-I", "-S", "-c", _BOOT, str(RUNTIMES_DIR),
                   "--state-dir", str(state), "--workspace", str(tmp_path / "ws"), *options]
        with open(log, "ab") as out:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        started.append((proc, 0))
        info = wait_until(lambda: proc.poll() is None and _read_info(state), 15, "server.json")
        server = Server(proc, int(info["port"]), str(info["token"]), log)
        client = server.client()
        try:
            started[-1] = (proc, int(client.alive()["shell_pid"]))
        finally:
            client.close()
        return server

    try:
        yield start
    finally:
        for proc, shell_pid in started:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if shell_pid and pid_alive(shell_pid):
                os.killpg(shell_pid, signal.SIGKILL)


def read_response(sock: socket.socket) -> tuple[int, str, bytes]:
    """Status, header text and body of one HTTP response read from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a full response: {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    headers = head.decode("latin-1")
    length = int(next(line.split(":", 1)[1] for line in headers.split("\r\n")
                      if line.lower().startswith("content-length:")))
    while len(body) < length:
        body += sock.recv(length - len(body))
    return int(headers.split()[1]), headers, body


def closed_by_server(sock: socket.socket, wait_s: float) -> bool:
    """True once the server has closed ``sock`` (EOF or reset) within ``wait_s``."""
    ready, _, _ = select.select([sock], [], [], wait_s)
    if not ready:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionError:
        return True


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmRSS:"))) * 1024


def test_an_unauthenticated_100_mb_body_gets_401_unread(
    start_server: Callable[..., Server],
) -> None:
    server = start_server()
    rss_before = rss_bytes(server.proc.pid)
    with server.connect() as sock:
        head = f"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: {100 * MB}\r\n\r\n"
        sock.sendall(head.encode() + b"x" * 65536)
        status, headers, body = read_response(sock)  # while 99.9% of the body is unsent
        assert status == 401 and json.loads(body)["error"] == "Unauthorized"
        assert "Connection: close" in headers
        sent = 65536
        with pytest.raises(OSError):  # reset, or the window stays shut: nobody reads
            sock.settimeout(2)
            while sent < 100 * MB:
                sent += sock.send(b"x" * MB)
        assert sent < 50 * MB, f"the server took {sent // MB} MB it should not have read"
    assert rss_bytes(server.proc.pid) - rss_before < 20 * MB
    assert server.client().alive()["pid"] == server.proc.pid


def test_a_storm_of_bad_requests_is_logged_once(start_server: Callable[..., Server]) -> None:
    server = start_server()
    for _ in range(30):
        with server.connect() as sock:
            sock.sendall(b"GET /alive HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n")
            assert read_response(sock)[0] == 401
    assert server.log_text().count("unauthorized request from 127.0.0.1") == 1


def test_a_stalled_client_is_dropped_while_others_are_served(
    start_server: Callable[..., Server],
) -> None:
    server = start_server("--read-timeout-s", "1")
    with server.connect() as slow:
        slow.sendall(b"POST /execute HTTP/1.1\r\nHost: x\r\nAuthoriz")  # then nothing
        started = time.monotonic()
        assert server.client().alive()["pid"] == server.proc.pid
        served_s = time.monotonic() - started
        assert closed_by_server(slow, 10)
        dropped_s = time.monotonic() - started
    assert served_s < dropped_s and 0.9 <= dropped_s < 5


def test_a_trickling_client_is_dropped_at_its_deadline(
    start_server: Callable[..., Server],
) -> None:
    server = start_server("--read-timeout-s", "1")
    with server.connect() as sock:
        sock.sendall(b"GET /alive HTTP/1.1\r\n")
        started = time.monotonic()
        for i in range(100):  # one header byte every 0.1 s keeps no per-read timeout busy
            if closed_by_server(sock, 0.1):
                break
            try:
                sock.send(b"X-Slow: %d\r\n" % i)
            except ConnectionError:
                break
        dropped_s = time.monotonic() - started
    assert 0.9 <= dropped_s < 5, dropped_s
    assert "bad or slow request from 127.0.0.1" in server.log_text()


@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [
        (f"Content-Length: {MAX_BODY_BYTES + 1}", 413, "PayloadTooLarge"),
        ("", 411, "LengthRequired"),
        ("Transfer-Encoding: chunked", 411, "LengthRequired"),
        ("Content-Length: abc", 400, "BadRequest"),
        ("Content-Length: -5", 400, "BadRequest"),
        ("Content-Length: 5\r\nContent-Length: 6", 400, "BadRequest"),
    ],
)
def test_bodies_are_read_only_within_their_limits(
    start_server: Callable[..., Server], headers: str, status: int, error: str
) -> None:
    server = start_server()
    with server.connect() as sock:
        extra = f"{headers}\r\n" if headers else ""
        request = (f"POST /execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}"
                   f"\r\n{extra}\r\n")
        sock.sendall(request.encode() + b"{}")
        got, head, body = read_response(sock)
        assert (got, json.loads(body)["error"]) == (status, error)
        assert "Connection: close" in head
        assert closed_by_server(sock, 5)


def test_connections_past_the_cap_are_closed_at_once(
    start_server: Callable[..., Server],
) -> None:
    server = start_server("--max-connections", "2", "--read-timeout-s", "5")
    request = f"GET /alive HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n\r\n"

    def served() -> socket.socket | None:
        """A connection the server serves (and so holds a slot for), or None: refused
        while an earlier connection's slot was still being released."""
        sock = server.connect()
        try:
            sock.sendall(request.encode())
            if read_response(sock)[0] == 200:
                return sock
        except ConnectionError:
            pass
        sock.close()
        return None

    held = [wait_until(served, 10, "a served connection") for _ in range(2)]
    try:
        with server.connect() as third:
            assert closed_by_server(third, 5)
    finally:
        for sock in held:
            sock.close()
    assert wait_until(lambda: _alive_once(server), 10)
    assert "too many connections from 127.0.0.1" in server.log_text()


def _alive_once(server: Server) -> bool:
    client = server.client()
    try:
        return client.alive()["pid"] == server.proc.pid
    except Exception:  # noqa: BLE001 - a refused try; wait_until tries again
        return False
    finally:
        client.close()


def test_the_client_outlives_idle_connections_the_server_closed(
    start_server: Callable[..., Server],
) -> None:
    server = start_server("--read-timeout-s", "0.3")
    client = server.client()
    try:
        client.alive()
        idle, _ = client._idle[0]
        assert idle.sock is not None
        wait_until(lambda: closed_by_server(idle.sock, 0.1), 5, "the idle connection closed")
        assert client.alive()["pid"] == server.proc.pid  # a fresh connection, transparently
    finally:
        client.close()
    assert "bad or slow request" not in server.log_text(), "an idle keep-alive is no trouble"


def test_an_action_over_the_body_cap_is_rejected_before_sending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(client_module, "MAX_BODY_BYTES", 1000)
    sandbox = LocalSandbox("cap-test", tmp_path / "ws", tmp_path / "rt")
    try:
        sandbox.start(1)
        outcome = sandbox.runtime.execute(
            "big", WriteFile(path="big.txt", content="x" * 2000),
            timeout_s=10, no_output_timeout_s=5,
        )
        assert outcome.status == "rejected" and "too large to send" in outcome.content
        assert sandbox.runtime.resolve("big").state == "absent"
        assert not (sandbox.workspace / "big.txt").exists()
    finally:
        sandbox.stop()


def test_a_connection_idle_past_the_keepalive_is_not_reused(
    start_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One the server is about to close (or has) is dropped, not tried and sent again."""
    monkeypatch.setattr(client_module, "KEEPALIVE_S", 0.0)
    server = start_server()
    client = server.client()
    try:
        client.alive()
        old, _ = client._idle[0]
        client.alive()
        assert old.sock is None  # closed by the client, never written to
        assert client._idle[0][0] is not old
    finally:
        client.close()


def test_binding_a_server_makes_no_name_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HTTPServer.server_bind`` asks DNS for the loopback address's name (``getfqdn``)
    in every new server; a sandbox server never reads that name, so it must not ask."""
    from trouper.runtimes.sandbox.server import SandboxServer
    from trouper.runtimes.sandbox.service import Service

    def no_lookup(*args: object) -> str:
        raise AssertionError("a name lookup while binding")

    monkeypatch.setattr(socket, "getfqdn", no_lookup)
    service = Service(str(tmp_path / "state"), str(tmp_path / "ws"), {}, "boot")
    server = SandboxServer(("127.0.0.1", 0), service, "t" * 64, idle_timeout_s=60.0)
    try:
        assert server.server_name == "127.0.0.1"
        assert server.server_port == server.port > 0
    finally:
        server.server_close()
