"""What one client may cost either HTTP server (the daemon, the remote runtime server),
tested on real processes over raw sockets with the right token: a body over the limit is
refused before it is sent, a chunked one cut at the limit; trickled headers, a trickled
body and an idle connection are dropped while others are served; connections per address
and in all are capped, and each kind of trouble is logged once a minute per address."""

from __future__ import annotations

import contextlib
import re
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trouper.testing import wait_until
from trouper.testing.daemon import running_daemon

pytestmark = pytest.mark.slow  # starts server processes

MB = 1024 * 1024
READ_TIMEOUT_S = 4
PER_CLIENT, IN_ALL = 6, 9


@dataclass
class Served:
    """One server as these tests attack it."""

    port: int
    pid: int
    token: str
    json_route: str
    """A POST route that reads a JSON body."""
    max_body_bytes: int
    log: Path

    def head(self, method: str, target: str, headers: dict[str, str] | None = None) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{self.port}",
                 f"Authorization: Bearer {self.token}",
                 *(f"{k}: {v}" for k, v in (headers or {}).items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30,
                                        source_address=(source, 0))

    def status(self, source: str = "127.0.0.1") -> int | None:
        """A health request's status from ``source`` (None: closed without one)."""
        with self.connect(source) as sock:
            sock.sendall(self.head("GET", "/v1/health"))
            return answer(sock)[0]


@pytest.fixture(scope="module")
def daemon_served(tmp_path_factory) -> Iterator[Served]:
    env = {"TROUPER_DAEMON_READ_TIMEOUT_S": str(READ_TIMEOUT_S),
           "TROUPER_DAEMON_MAX_CONNECTIONS": str(IN_ALL),
           "TROUPER_DAEMON_MAX_CONNECTIONS_PER_CLIENT": str(PER_CLIENT)}
    with running_daemon(tmp_path_factory.mktemp("limits"), env=env) as d:
        yield Served(d.port, d.pid, d.token, "/v1/sessions", MB,
                     d.home.root / "logs" / "daemon.log")


@pytest.fixture(params=["daemon", "remote"])
def served(request, remote_server) -> Served:
    if request.param == "daemon":
        return request.getfixturevalue("daemon_served")
    server = remote_server("--read-timeout-s", str(READ_TIMEOUT_S), "--max-connections",
                           str(IN_ALL), "--max-connections-per-client", str(PER_CLIENT))
    return Served(server.port, server.proc.pid, server.token, "/v1/sessions/s1/start",
                  64 * MB, server.log)


def answer(sock: socket.socket, timeout_s: float = 30) -> tuple[int | None, bytes]:
    """The status and head of the answer on ``sock`` (None: closed or reset first)."""
    data, deadline = b"", time.monotonic() + timeout_s
    while b"\r\n\r\n" not in data:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return None, data
        if not chunk:
            return None, data
        data += chunk
    match = re.match(rb"HTTP/1\.1 (\d{3})", data)
    return (int(match.group(1)) if match else None), data.partition(b"\r\n\r\n")[0].lower()


def closed_by_server(sock: socket.socket, within_s: float, each_s: float = 0.5,
                     trickle: bytes = b"") -> bool:
    """Whether the server closes ``sock`` within ``within_s``; meanwhile ``trickle`` is
    sent every ``each_s`` (a slow client's pace, not a wait for a condition)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if trickle:
            try:
                sock.sendall(trickle)
            except OSError:
                return True
        readable, _, _ = select.select([sock], [], [], each_s)
        if readable:
            try:
                if not sock.recv(65536):
                    return True
            except ConnectionResetError:
                return True
    return False


def rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


def log_lines(served: Served, pattern: str) -> list[str]:
    return [line for line in served.log.read_text(errors="replace").splitlines()
            if re.search(pattern, line)]


def test_a_body_declared_over_the_limit_is_answered_before_it_is_sent(served):
    declared = max(50 * MB, served.max_body_bytes + 1)
    before = rss_kb(served.pid)
    began = time.monotonic()
    with served.connect() as sock:
        sock.sendall(served.head("POST", served.json_route, {
            "Content-Type": "application/json", "Content-Length": str(declared)}))
        status, head = answer(sock)  # not a byte of the body sent yet
        took_s = time.monotonic() - began
        assert status == 413, head
        assert b"connection: close" in head
        sent = 0
        with contextlib.suppress(OSError):  # the server closed: the body goes nowhere
            for _ in range(50):
                sock.sendall(b"x" * MB)
                sent += MB
        assert closed_by_server(sock, 10)
    grown_kb = rss_kb(served.pid) - before
    print(f"413 after {took_s * 1000:.0f} ms; {sent // MB} MB accepted by the kernel after "
          f"it; the server's RSS grew {grown_kb} kB")
    assert grown_kb < 20_000
    assert served.status() == 200


def test_a_chunked_body_is_cut_at_the_limit(served):
    chunk = b"x" * (256 * 1024)
    framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    total = 2 * served.max_body_bytes + 32 * MB
    with served.connect() as sock:
        sock.sendall(served.head("POST", served.json_route, {
            "Content-Type": "application/json", "Transfer-Encoding": "chunked"}))
        sent = 0
        with contextlib.suppress(OSError):  # cut: the server stopped reading
            while sent < total and not select.select([sock], [], [], 0)[0]:
                sock.sendall(framed)
                sent += len(chunk)
        status, head = answer(sock)
    assert status == 413, head
    assert sent < total  # answered while the body was still coming
    assert served.status() == 200


def test_trickled_headers_an_idle_connection_and_a_trickled_body_are_dropped(served):
    within_s = READ_TIMEOUT_S + 15
    with served.connect() as idle, served.connect() as heads, served.connect() as body:
        heads.sendall(b"GET /v1/health HTTP/1.1\r\n")
        body.sendall(served.head("POST", served.json_route, {
            "Content-Type": "application/json", "Content-Length": "100000"}) + b"{")
        assert served.status() == 200  # others are served meanwhile
        assert closed_by_server(heads, within_s, trickle=b"X")
        assert closed_by_server(body, within_s, trickle=b" ")
        assert closed_by_server(idle, within_s)
        assert served.status() == 200
    wait_until(lambda: log_lines(served, "slow request (headers|body) from 127.0.0.1"), 10,
               "the slow requests logged")


def test_connections_are_capped_per_address_and_in_all(served):
    with contextlib.ExitStack() as held:
        for _ in range(PER_CLIENT):
            held.enter_context(served.connect("127.0.0.1"))
        refusals = [served.status("127.0.0.1") for _ in range(3)]
        assert set(refusals) <= {503, None}, refusals  # 503, or reset before it was read
        assert served.status("127.0.0.2") == 200  # another address is served
        for _ in range(IN_ALL - PER_CLIENT):
            held.enter_context(served.connect("127.0.0.2"))
        assert served.status("127.0.0.3") in (503, None)  # none left in all
    wait_until(lambda: served.status("127.0.0.1") == 200, 10, "served again once closed")
    lines = wait_until(lambda: log_lines(served, "too many connections from 127.0.0.1"), 10,
                       "the refusals logged")
    assert len(lines) == 1, lines  # three refusals, one line a minute
