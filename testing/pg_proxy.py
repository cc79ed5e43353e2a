"""A TCP proxy in front of a PostgreSQL server that can lose the answer to a commit.

The failure a shared store adds to a local file: the server commits a transaction, and
the connection breaks before the client hears so. The client sees an error, the log
holds the write. ``AckDropper`` passes every byte through until armed; armed with ``n``,
it cuts each of the next ``n`` connections whose transaction inserted rows (the server
answered an ``INSERT``: an append's events, an owner's claim) at the server's
``CommandComplete`` for ``COMMIT``: that message is never forwarded, both sockets close.
The commit stands. (Read from the server's answers: a statement the client prepared
does not send its text again.)

    with AckDropper(server_url) as proxy:
        store = open_store(proxy.url)
        proxy.arm(1)               # the next append's commit is not acknowledged
"""

from __future__ import annotations

import socket
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"
"""The server's CommandComplete message for a COMMIT."""
INSERTED = b"C\x00\x00\x00\x0fINSERT 0 "
"""The start of the server's CommandComplete for an INSERT (``INSERT 0 <rows>``; its
length field varies with the digits, so the one-digit form is matched: 1 to 9 rows)."""


class AckDropper:
    """A loopback proxy to the server of ``url``; ``url`` of its own goes through it."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        userinfo = parts.netloc.rpartition("@")[0]
        self.url = urlunsplit(parts._replace(netloc=f"{userinfo}@127.0.0.1:{port}"))
        self._lock = threading.Lock()
        self._armed = 0
        self.dropped = 0
        """Commits whose answer was lost so far."""
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, n: int = 1) -> None:
        with self._lock:
            self._armed += n

    def __enter__(self) -> AckDropper:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                _close(sock)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._upstream, args=(client, server),
                             daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client),
                             daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket) -> None:
        while data := _recv(client):
            if not _send(server, data):
                break
        _close(server)

    def _downstream(self, server: socket.socket, client: socket.socket) -> None:
        inserted = False
        while data := _recv(server):
            inserted = inserted or INSERTED in data
            at = data.find(COMMIT_DONE)
            if at >= 0 and inserted:
                inserted = False
                with self._lock:
                    drop = self._armed > 0
                    if drop:
                        self._armed -= 1
                        self.dropped += 1
                if drop:  # the server committed; the client never hears it
                    _send(client, data[:at])
                    break
            if not _send(client, data):
                break
        _close(client)
        _close(server)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
