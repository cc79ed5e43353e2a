"""The MCP servers of one sandbox: each started on first use and kept for the next call.

``Service.perform`` hands this the two MCP actions: ``mcp_tools`` (start the session's
servers and list their tools) and ``mcp`` (call one tool). The ``mcp`` package is the
client; it is imported with this module, which the service imports only when a session
uses a server (so a sandbox without one never pays for it, and a sandbox server on a
machine without the package says so in the action's outcome).

One thread runs an asyncio loop for every server of the sandbox; an action's worker
thread blocks on its call. A call has one outcome:

- the tool's result (``error`` when the tool says it failed), its text cut like any
  output (head and tail, the whole in a file of the workspace);
- ``error`` with ``timed_out="hard"`` when no answer came within its limit (the server
  is sent a cancel; it may have done part of the work, which the outcome says);
- ``error`` when the server could not be started (the call was never sent);
- ``lost`` when the server died while the call was in flight: an MCP server cannot be
  asked whether it ran a call, so it is never sent again. The next call starts the
  server afresh.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Dict

import anyio
import mcp_types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from .mcp_stdio import ServerProcess, stdio_streams
from .output import fit_text

logger = logging.getLogger(__name__)

CLOSE_WAIT_S = 5.0
"""How long closing the sandbox waits for its servers to stop."""
EXIT_STATUS_WAIT_S = 1.0
"""How long a call cut off waits for its server's exit status (for the message)."""
RESULT_MARGIN_S = 30.0
"""Time past a call's limit (and its server's start) allowed before the worker gives up
waiting on the loop (it never should: every wait inside is bounded)."""
CLIENT_INFO = mcp_types.Implementation(name="trouper", version="1")

Outcome = Dict[str, Any]


class NotStarted(Exception):
    """The server could not be started or reached; the message says why."""


class McpHub:
    """The servers of one sandbox and the loop they run on."""

    def __init__(self, launcher: Callable[[dict[str, Any]], Any], mask: Callable[[str], str],
                 workspace: str, max_output_chars: int) -> None:
        self._launcher = launcher
        self._mask = mask
        self._workspace = workspace
        self._max_output_chars = max_output_chars
        self._connections: dict[str, Connection] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp",
                                        daemon=True)
        self._thread.start()
        self.closing = False
        self._close_lock = threading.Lock()

    # ---- from the action workers ----

    def perform(self, action_id: str, action: dict[str, Any], timeout_s: float) -> Outcome:
        """The outcome of an ``mcp`` or ``mcp_tools`` action (see the module doc)."""
        if self.closing:
            return {"status": "interrupted", "content": (
                "Not run: trouper was stopping this sandbox and its MCP servers.")}
        if action["kind"] == "mcp_tools":
            servers = action["servers"]
            # a start, then a listing, each bounded by the server's startup_timeout_s
            limit = 2 * max([float(s.get("startup_timeout_s") or 30) for s in servers] + [1.0])
            coroutine = self._list(servers)
        else:
            spec = action.get("spec")
            if not isinstance(spec, dict):
                return {"status": "error", "content": (
                    f"The MCP server {action['server']!r} is not one of this session's.")}
            limit = float(spec.get("startup_timeout_s") or 30) + timeout_s
            coroutine = self._call(action_id, spec, action["tool"],
                                   action.get("arguments") or {}, timeout_s)
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(limit + RESULT_MARGIN_S)
        except concurrent.futures.TimeoutError:  # every wait inside is bounded: a bug
            future.cancel()
            logger.error("MCP action %s had no outcome within %g s", action_id,
                         limit + RESULT_MARGIN_S)
            return {"status": "lost", "content": (
                "The MCP action had no outcome in time; nobody can know whether it ran, so "
                "it is not run again: check its effects before repeating it.")}

    def close(self) -> None:
        """Stop every server (in-flight calls end ``interrupted``) and the loop; once."""
        with self._close_lock:
            if self.closing:
                return
            self.closing = True
        stopping = asyncio.run_coroutine_threadsafe(self._stop_all(), self._loop)
        try:
            stopping.result(CLOSE_WAIT_S)
        except Exception:  # noqa: BLE001 - closing goes on whatever a server does
            logger.warning("MCP servers did not all stop within %g s", CLOSE_WAIT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_WAIT_S)

    # ---- on the loop ----

    async def _stop_all(self) -> None:
        await asyncio.gather(*(c.close() for c in list(self._connections.values())))

    async def _connected(self, spec: dict[str, Any]) -> Connection:
        """The server's live connection: started (or started again, once it died)."""
        key = json.dumps(spec, sort_keys=True)
        connection = self._connections.get(key)
        if connection is None or not connection.usable:
            if connection is not None:
                await connection.close()
            launch = self._launcher(spec) if spec.get("command") else None
            connection = self._connections[key] = Connection(spec, launch)
        await connection.started(float(spec.get("startup_timeout_s") or 30))
        return connection

    async def _list(self, servers: list[dict[str, Any]]) -> Outcome:
        listed = await asyncio.gather(*(self._list_one(spec) for spec in servers))
        names = [str(spec.get("name")) for spec in servers]
        return {"status": "ok", "content": json.dumps({"servers": dict(zip(names, listed))})}

    async def _list_one(self, spec: dict[str, Any]) -> dict[str, Any]:
        try:
            connection = await self._connected(spec)
            with anyio.fail_after(float(spec.get("startup_timeout_s") or 30)):
                tools = await connection.list_tools()
        except NotStarted as e:
            return {"error": self._mask(str(e))}
        except TimeoutError:
            return {"error": "it did not list its tools in time"}
        except Exception as e:  # noqa: BLE001 - a server's failure is its entry, not ours
            return {"error": self._mask(f"listing its tools failed: {_why(e)}")}
        return {"tools": tools}

    async def _call(self, action_id: str, spec: dict[str, Any], tool: str,
                    arguments: dict[str, Any], timeout_s: float) -> Outcome:
        name = spec.get("name")
        try:
            connection = await self._connected(spec)
        except NotStarted as e:
            return {"status": "error", "content": self._mask(
                f"The MCP server {name!r} could not be started, so the call was not sent: {e}")}
        try:
            result = await connection.session.call_tool(  # type: ignore[union-attr]
                tool, arguments, read_timeout_seconds=timeout_s)
        except MCPError as e:
            if e.code == mcp_types.REQUEST_TIMEOUT:
                return {"status": "error", "timed_out": "hard", "content": (
                    f"No answer from the MCP tool {tool!r} of {name!r} within {timeout_s:g} "
                    "s: it was sent a cancel. It may have done part or all of its work: "
                    "check before calling it again.")}
            if not connection.gone and e.code != mcp_types.CONNECTION_CLOSED:
                return {"status": "error", "content": self._mask(
                    f"The MCP server {name!r} refused the call: {e.message}")}
            return await self._cut_off(connection, name, tool)
        except Exception as e:  # noqa: BLE001 - the transport broke mid-call
            logger.warning("MCP call %s to %r broke: %s", action_id, name, _why(e))
            return await self._cut_off(connection, name, tool)
        text = self._mask(_text(result))
        content, elided, full_path = fit_text(text, self._max_output_chars, self._workspace,
                                              action_id)
        return {"status": "error" if result.is_error else "ok", "content": content,
                "elided_chars": elided, "full_output_path": full_path}

    async def _cut_off(self, connection: Connection, name: Any, tool: str) -> Outcome:
        """The outcome of a call whose server went away while it was in flight."""
        connection.broken = True
        await connection.exited(EXIT_STATUS_WAIT_S)  # for its status in the message
        if self.closing:
            return {"status": "interrupted", "content": (
                f"Interrupted: trouper stopped this sandbox while the MCP tool {tool!r} of "
                f"{name!r} ran, and its server with it. It was not called again; check its "
                "effects before calling it again.")}
        return {"status": "lost", "content": self._mask(
            f"The MCP server {name!r} went away while the tool {tool!r} ran "
            f"({connection.why_gone()}). Nobody can know whether the tool did its work, so "
            "it was not called again: check its effects before calling it again. The next "
            "call starts the server afresh.")}


class Connection:
    """One server's connection, held open by a task of its own until it is closed."""

    def __init__(self, spec: dict[str, Any], launch: Any) -> None:
        self.spec = spec
        self.launch = launch
        self.process: ServerProcess | None = ServerProcess() if launch else None
        self.session: ClientSession | None = None
        self.error: str | None = None
        self.broken = False
        """A call found the transport broken: the next call connects again."""
        self.http_refusal = ""
        """The last error status an HTTP server answered (``HTTP 401 Unauthorized``)."""
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._done = asyncio.Event()
        self._task = asyncio.ensure_future(self._hold())

    @property
    def gone(self) -> bool:
        return self.process is not None and self.process.gone.is_set()

    @property
    def usable(self) -> bool:
        """Still worth calling: starting, or open and not gone nor broken."""
        return not (self._done.is_set() or self.gone or self.broken)

    def why_gone(self) -> str:
        if self.process is not None and self.process.process is not None:
            return "its process " + self.process.why_gone()
        return self.error or "the connection broke"

    async def exited(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for a stdio server's process to have exited."""
        process = self.process.process if self.process is not None else None
        if process is not None:
            try:
                await asyncio.wait_for(process.wait(), wait_s)
            except asyncio.TimeoutError:
                pass

    async def started(self, timeout_s: float) -> None:
        """Wait for it to be open; NotStarted says why it is not."""
        try:
            with anyio.fail_after(timeout_s):
                await self._ready.wait()
        except TimeoutError:
            await self.close()
            tail = self.process.stderr_tail() if self.process is not None else ""
            raise NotStarted(f"it did not answer within {timeout_s:g} s" + (
                f"; its stderr ends: {tail}" if tail else "")) from None
        if self.session is None:
            raise NotStarted(self.error or "it closed before it was ready")

    async def list_tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor = None
        while True:
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self.session.list_tools(params=params)  # type: ignore[union-attr]
            tools += [{"name": t.name, "description": t.description or "",
                       "inputSchema": t.input_schema} for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def close(self) -> None:
        self._stop.set()
        try:
            with anyio.fail_after(CLOSE_WAIT_S):
                await self._done.wait()
        except TimeoutError:
            self._task.cancel()

    async def _hold(self) -> None:
        try:
            async with self._streams() as (read, write):
                async with ClientSession(read, write, client_info=CLIENT_INFO) as session:
                    await session.initialize()
                    self.session = session
                    self._ready.set()
                    await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - recorded for the caller's message
            self.error = self._failure(e)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self._done.set()
            self._ready.set()

    @asynccontextmanager
    async def _streams(self) -> AsyncIterator[Any]:
        if self.launch is not None:
            assert self.process is not None
            async with stdio_streams(self.launch, self.process) as streams:
                yield streams
            return
        headers = {str(k): str(v) for k, v in (self.spec.get("headers") or {}).items()}
        client = create_mcp_http_client(headers=headers)

        async def note_refusal(response: Any) -> None:  # the SDK's errors drop the status
            if response.status_code >= 400:
                self.http_refusal = f"HTTP {response.status_code} {response.reason_phrase}"

        hooks = client.event_hooks
        client.event_hooks = {**hooks, "response": [*hooks.get("response", []), note_refusal]}
        async with client:
            async with streamable_http_client(self.spec["url"], http_client=client) as (
                    read, write):
                yield read, write

    def _failure(self, error: BaseException) -> str:
        if isinstance(error, FileNotFoundError):
            return f"no such program: {self.spec['command'][0]!r}"
        if self.process is not None and self.process.process is not None and (
                self.process.gone.is_set() or self.process.exit_status is not None):
            return "its process " + self.process.why_gone()
        if self.launch is None:
            answered = f" (it answered {self.http_refusal})" if self.http_refusal else ""
            return f"cannot use {self.spec.get('url')}: {_why(error)}{answered}"
        return _why(error)


def _why(error: BaseException) -> str:
    """The innermost error of a task group's, in one line."""
    while getattr(error, "exceptions", None):
        error = error.exceptions[0]  # type: ignore[attr-defined]
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if text != type(error).__name__ else text


def _text(result: Any) -> str:
    """A tool's result as text: its text blocks, and a note for each other block."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, about {len(block.data) * 3 // 4} bytes]")
        elif kind == "resource":
            text = getattr(block.resource, "text", None)
            parts.append(text if text is not None else f"[resource {block.resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}]")
    if not any(p.strip() for p in parts) and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts) if parts else "(no output)"
