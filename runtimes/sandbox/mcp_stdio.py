"""An MCP server over stdio, started where the agent's shell runs, bridged to an MCP
client session (newline-delimited JSON-RPC on its stdin and stdout).

The ``mcp`` package's own ``stdio_client`` cannot start a process the way a sandbox must:
confined in the child before it execs (the local runtime), or through ``docker exec`` (the
Docker runtime, given here as the ``argv``). So this transport starts the process itself
(``Launch``) and keeps what the sandbox needs to know of it (``ServerProcess``): whether it
is gone (its stdout ended), its exit status, and the end of its stderr (for a failure's
message, masked by the caller; never written to disk). The process gets a session of its
own, so stopping it kills everything it started.

Imported only when a session has MCP servers (it needs the ``mcp`` package).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import deque
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

MAX_LINE_BYTES = 64 * 1024 * 1024
"""The longest message a server may send (one line)."""
STDERR_TAIL_BYTES = 4096
"""How much of the end of a server's stderr is kept for a failure's message."""
EXIT_GRACE_S = 2.0
"""How long a server may take to exit once its stdin is closed before it is killed."""


@dataclass
class Launch:
    """How to start one stdio server."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    preexec: Callable[[], None] | None = None
    """Run in the child before it execs (the local shell's confinement)."""


@dataclass
class ServerProcess:
    """What the sandbox knows of a running stdio server."""

    process: Any = None
    """The ``asyncio.subprocess.Process``, once started."""
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when its stdout ended: it exited, or closed it (the connection is over)."""
    _tail: deque = field(default_factory=lambda: deque(maxlen=64))

    def keep_stderr(self, chunk: bytes) -> None:
        self._tail.append(chunk)

    def stderr_tail(self) -> str:
        """The last ``STDERR_TAIL_BYTES`` of its stderr, as text on one line (its lines
        joined by `` | ``: a failure's first line is what a session's reason shows)."""
        data = b"".join(self._tail)[-STDERR_TAIL_BYTES:]
        lines = data.decode("utf-8", "replace").splitlines()
        return " | ".join(line.strip() for line in lines if line.strip())

    @property
    def exit_status(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def why_gone(self) -> str:
        """``exited with status 3; its stderr ends: ...``, in words."""
        status = self.exit_status
        what = ("closed its output" if status is None else
                f"was killed by signal {-status}" if status < 0 else
                f"exited with status {status}")
        if status is not None and 128 < status < 160:  # how docker exec and shells say it
            what += f" (128 + {status - 128}: killed by signal {status - 128}, likely)"
        tail = self.stderr_tail()
        return what + (f"; its stderr ends: {tail}" if tail else " (nothing on its stderr)")


@asynccontextmanager
async def stdio_streams(launch: Launch, server: ServerProcess) -> AsyncIterator[tuple]:
    """Start the server and yield the (read, write) streams an MCP ``ClientSession``
    takes. Leaving stops the server: stdin closed, then its whole session killed.

    Raises OSError when it cannot be started (no such program...)."""
    server.process = process = await asyncio.create_subprocess_exec(
        *launch.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=launch.env, cwd=launch.cwd,
        preexec_fn=launch.preexec, start_new_session=True, limit=MAX_LINE_BYTES)
    to_session, from_server = anyio.create_memory_object_stream(0)
    to_server, from_session = anyio.create_memory_object_stream(0)

    async def read_stdout() -> None:
        async with to_session:
            while True:
                try:
                    line = await process.stdout.readline()
                except (ValueError, OSError) as e:  # a line over the limit, a broken pipe
                    await to_session.send(e)
                    break
                if not line:
                    break
                text = line.decode("utf-8", "replace").strip()
                if text:
                    await to_session.send(_message(text))
        server.gone.set()

    async def write_stdin() -> None:
        async with from_session:
            async for message in from_session:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                try:
                    process.stdin.write(data.encode("utf-8") + b"\n")
                    await process.stdin.drain()
                except (OSError, ConnectionError):
                    return  # the server is gone: its stdout's end says so

    async def read_stderr() -> None:
        while True:
            chunk = await process.stderr.read(4096)
            if not chunk:
                return
            server.keep_stderr(chunk)

    async with anyio.create_task_group() as group:
        group.start_soon(read_stdout)
        group.start_soon(write_stdin)
        group.start_soon(read_stderr)
        try:
            yield from_server, to_server
        finally:
            with anyio.CancelScope(shield=True):
                await stop(process)
            group.cancel_scope.cancel()


def _message(text: str) -> Any:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(text))
    except ValueError as e:  # the session sees it as a stream error, not a reply
        return e


async def stop(process: Any) -> None:
    """Close its stdin, give it ``EXIT_GRACE_S`` to exit, then kill its session."""
    with suppress(OSError, RuntimeError):
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), EXIT_GRACE_S)
        return
    except asyncio.TimeoutError:
        pass
    kill(process)
    with suppress(asyncio.TimeoutError):
        await asyncio.wait_for(process.wait(), EXIT_GRACE_S)


def kill(process: Any) -> None:
    """SIGKILL the server and everything in its session."""
    with suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    with suppress(OSError):
        process.kill()
