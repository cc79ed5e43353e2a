"""A streamable HTTP MCP server on loopback for tests: the ``mcp`` package's own server
(``MCPServer``), so trouper's client is checked against the reference implementation. It
runs in a process of its own, so a test can kill it mid-call.

Every request must carry ``Authorization: Bearer <token>`` (401 otherwise; the token
reaches the process in its environment, never its argv): how a session gives a server its
secret (``headers`` with ``<secret:NAME>``) is what a test checks. In its folder it
writes ``calls.log`` (a line per tool call, before the call runs), ``refused.log`` (a
line per request turned away) and ``hanging`` (once ``hang`` began).

    server = McpHttpServer(tmp_path / "http", "tok-123").start()
    ...  # mcp=[{"name": "web", "url": server.url, "headers": {...}}]
    server.stop()
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from .faults import wait_until

TOKEN_ENV = "TROUPER_TEST_MCP_TOKEN"


class McpHttpServer:
    """The server process: ``start()`` waits until it listens, ``stop()`` ends it,
    ``kill()`` SIGKILLs it (a server dying mid-call)."""

    def __init__(self, folder: Path, token: str) -> None:
        self.folder = folder
        self.token = token
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> McpHttpServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        port_file = self.folder / "port"
        self._process = subprocess.Popen(
            [sys.executable, "-m", "trouper.testing.mcp_http", str(self.folder)],
            env={**os.environ, TOKEN_ENV: self.token}, stdin=subprocess.DEVNULL)
        try:
            port = wait_until(lambda: port_file.exists() and port_file.read_text().strip(),
                              30, "the MCP HTTP server to listen")
        except BaseException:  # no fixture's end will stop a server that never answered
            self.kill()
            raise
        self.url = f"http://127.0.0.1:{port}/mcp"
        return self

    def calls(self) -> list[str]:
        path = self.folder / "calls.log"
        return path.read_text().split() if path.exists() else []

    def refused(self) -> int:
        path = self.folder / "refused.log"
        return len(path.read_text().split("\n")) - 1 if path.exists() else 0

    def kill(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(10)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def _app(folder: Path, token: str) -> Any:
    from mcp.server.mcpserver import MCPServer

    mcp = MCPServer("trouper-test-http")

    def note(name: str, line: str) -> None:
        with open(folder / name, "a") as f:
            f.write(line + "\n")

    @mcp.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        note("calls.log", "echo")
        return text

    @mcp.tool()
    async def hang() -> str:
        """Never answer (a test kills the server meanwhile)."""
        note("calls.log", "hang")
        (folder / "hanging").touch()
        await asyncio.Event().wait()
        return "never"

    app = mcp.streamable_http_app()
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != (
                expected):
            note("refused.log", scope.get("path", ""))
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="an MCP server over HTTP, for tests")
    parser.add_argument("folder", type=Path)
    folder = parser.parse_args().folder
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    server = uvicorn.Server(uvicorn.Config(_app(folder, os.environ[TOKEN_ENV]),
                                           log_level="warning"))
    (folder / "port.tmp").write_text(str(sock.getsockname()[1]))
    (folder / "port.tmp").rename(folder / "port")  # whole, or not there
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
