"""The daemon's HTTP API (``/v1``), its streams and its web page: a FastAPI app.

Every route sits behind ``auth.Guard`` (the token, the Host and the Origin); errors are
``{"error": {"code", "message"}}`` (plus ``field`` for a refused input). docs/daemon.md
lists the routes with examples.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Header, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..client.session import budget_text
from ..config.settings import Settings, settings
from ..exceptions import (
    ConfigError,
    InvalidRequest,
    RequestTimeout,
    StoreUnavailable,
    TrouperError,
    UnknownSession,
)
from ..messages.events import AgentState
from ..serving.asgi import RequestLimits
from ..serving.limits import INT64_MAX, HttpLimits
from .auth import SUBPROTOCOL, Guard, limit_error_body
from .bodies import Answer, Budget, CreateSession, ForkBody, Message
from .service import Conflict, Service
from .stream import WS_CLOSE_CODES, StreamLimits, Streams, sse_lines, ws_send_loop

if TYPE_CHECKING:
    from ..client.embedded import Trouper
    from ..cluster.member import Member

logger = logging.getLogger(__name__)

PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
              "/page/app.js": ("app.js", "text/javascript; charset=utf-8"),
              "/page/list.js": ("list.js", "text/javascript; charset=utf-8"),
              "/page/changes.js": ("changes.js", "text/javascript; charset=utf-8"),
              "/page/style.css": ("style.css", "text/css; charset=utf-8")}
_PAGE_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; connect-src 'self'; img-src 'self' data:; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
}
StateName = Literal[tuple(s.value for s in AgentState)]  # type: ignore[valid-type]
# Numbers that reach the store fit SQLite's signed 64 bits, so 2**63 is a 422, not a 500.
After = Query(0, ge=0, le=INT64_MAX, description="Events with a greater seq.")
Offset = Query(0, ge=0, le=INT64_MAX)
Cursor = Query(None, max_length=200)


def error(status: int, code: str, message: str, field: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if field:
        body["field"] = field
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _trouper_error(exc: TrouperError) -> JSONResponse:
    if isinstance(exc, UnknownSession):
        return error(404, "unknown_session", str(exc))
    if isinstance(exc, ConfigError):
        return error(422, "invalid", str(exc), exc.field)
    if isinstance(exc, Conflict):
        return error(409, "conflict", str(exc))
    if isinstance(exc, InvalidRequest):
        return error(409, "invalid_state", str(exc))
    if isinstance(exc, RequestTimeout | StoreUnavailable):
        return error(503, "unavailable", str(exc), headers={"Retry-After": "1"})
    return error(500, "internal", f"{type(exc).__name__}: {exc}")


def http_limits(given: Settings | None = None) -> HttpLimits:
    """The daemon's HTTP limits from its settings (``TROUPER_DAEMON_*``)."""
    s = given or settings()
    return HttpLimits(
        max_body_bytes=s.daemon_max_body_bytes, max_header_bytes=s.daemon_max_header_bytes,
        header_timeout_s=s.daemon_read_timeout_s, body_timeout_s=s.daemon_read_timeout_s,
        max_connections=s.daemon_max_connections,
        max_connections_per_client=s.daemon_max_connections_per_client)


def create_app(trouper: Trouper, *, token: str, hosts: frozenset[str],
               limits: StreamLimits | None = None, http: HttpLimits | None = None,
               member: Member | None = None) -> Any:
    """The ASGI app: the FastAPI app inside ``RequestLimits`` (sizes) inside its ``Guard``
    (the token first). ``app.state`` of the inner app holds the ``Service`` and the
    ``Streams`` (``.fastapi`` reaches it). ``member``: this daemon's membership of a
    cluster, if it is in one."""
    api = FastAPI(title="trouper daemon", version="1", docs_url=None, redoc_url=None,
                  openapi_url="/v1/openapi.json")
    service = Service(trouper, token, member)
    streams = Streams(limits or StreamLimits.from_env())
    api.state.service, api.state.streams, api.state.started = service, streams, time.time()

    @api.exception_handler(TrouperError)
    async def _on_trouper_error(request: Request, exc: TrouperError) -> JSONResponse:
        return _trouper_error(exc)

    @api.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first["loc"] if p not in ("body", "query", "path", "header")
               and not (isinstance(p, int) and first["loc"][0] == "query")]
        field = ".".join(loc) or None
        return error(422, "invalid", f"{field or 'body'}: {first['msg']}", field)

    @api.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error(exc.status_code, code, str(exc.detail))

    @api.get("/v1/health")
    def health() -> dict[str, Any]:
        """The daemon answers: its pid, uptime, sessions and open streams."""
        return {"ok": True, "pid": os.getpid(), "uptime_s": time.time() - api.state.started,
                "sessions": len(service.store.sessions(replaced=True)),  # every one kept
                "streams": streams.count}

    @api.get("/v1/cluster")
    def cluster() -> dict[str, Any]:
        """The daemons on this store: their state, heartbeat, capabilities and sessions
        (``cluster`` false, and this daemon alone, on a store of its own)."""
        if member is None:
            return {"cluster": False, "me": None, "daemons": []}
        return {"cluster": True, "me": member.name,
                "daemons": [d.to_json() for d in member.daemons()]}

    @api.post("/v1/sessions", status_code=201)
    def create_session(body: CreateSession) -> JSONResponse:
        """Start a session. With ``id``: the same id and body return the same session
        (200), another body 409."""
        view, created = service.create(body)
        return JSONResponse(view, status_code=201 if created else 200)

    @api.get("/v1/sessions")
    def list_sessions(limit: int = 50, cursor: str | None = Cursor, offset: int = Offset,
                      state: list[StateName] | None = Query(default=None),
                      usage: bool = False, replaced: bool = False) -> dict[str, Any]:
        """Sessions, newest first; page with ``cursor`` (or ``offset``); filter by state;
        ``usage``: each row with its ``cost_usd`` and ``iterations``; ``replaced``: the
        sessions a rewind replaced too (each with its ``replaced_by``)."""
        states = [AgentState(s) for s in state] if state else None
        return service.page(states=states, cursor=cursor, offset=offset, limit=limit,
                            usage=usage, replaced=replaced)

    @api.get("/v1/sessions/{session_id}")
    def get_session(session_id: str) -> dict[str, Any]:
        return service.detail(session_id)

    # A command's Idempotency-Key: sent again under it, the command is answered, not
    # carried out twice (a client that lost the answer to a dropped connection retries).
    Key = Header(default=None, alias="Idempotency-Key")

    @api.post("/v1/sessions/{session_id}/messages")
    def send_message(session_id: str, body: Message, key: str | None = Key) -> dict[str, Any]:
        return service.command(session_id, "send", body.text, key=key)

    def _command(name: str) -> Any:
        def run(session_id: str, key: str | None = Key) -> dict[str, Any]:
            return service.command(session_id, name, key=key)
        run.__name__ = f"{name}_session"
        run.__doc__ = f"{name.capitalize()} the session."
        return run

    for name in ("pause", "resume", "stop"):
        api.post(f"/v1/sessions/{{session_id}}/{name}")(_command(name))

    @api.post("/v1/sessions/{session_id}/approve")
    def approve(session_id: str, body: Answer | None = None,
                key: str | None = Key) -> dict[str, Any]:
        """Run the action waiting for approval (``action_id``: only if it is that one)."""
        answer = body or Answer()
        return service.command(session_id, "approve", action_id=answer.action_id, key=key)

    @api.post("/v1/sessions/{session_id}/reject")
    def reject(session_id: str, body: Answer | None = None,
               key: str | None = Key) -> dict[str, Any]:
        """Do not run the waiting action: recorded ``rejected`` with ``reason``."""
        answer = body or Answer()
        return service.command(session_id, "reject", answer.reason, answer.action_id,
                               key=key)

    @api.post("/v1/sessions/{session_id}/budget")
    def set_budget(session_id: str, body: Budget, key: str | None = Key) -> dict[str, Any]:
        """Set the budget from now on (``max_cost_usd``, ``max_iterations``); a session
        paused for a spent budget carries on if the new one lasts, else 409."""
        return service.command(session_id, "budget",
                               budget_text(body.max_cost_usd, body.max_iterations), key=key)

    @api.post("/v1/sessions/{session_id}/fork", status_code=201)
    def fork(session_id: str, body: ForkBody) -> dict[str, Any]:
        """A new session starting where this one was at ``at_seq``, its files included;
        it waits for the user, or carries on with ``message``. The original is untouched."""
        return service.fork(session_id, body.at_seq, body.message, body.llm, body.workspace)

    @api.post("/v1/sessions/{session_id}/rewind", status_code=201)
    def rewind(session_id: str, body: ForkBody) -> dict[str, Any]:
        """A fork (the same body) that takes this session's place in the list: this one
        is stopped if it is still working and listed only with ``?replaced=true``."""
        return service.fork(session_id, body.at_seq, body.message, body.llm, body.workspace,
                            rewind=True)

    @api.get("/v1/sessions/{session_id}/events")
    def events(session_id: str, after: int = After, limit: int = 1000) -> dict[str, Any]:
        """Events with seq > ``after``: ``{events, next_after, head_seq}``."""
        return service.events(session_id, after, limit)

    @api.get("/v1/sessions/{session_id}/diff")
    def diff(session_id: str) -> dict[str, Any]:
        """What the agent changed: the workspace compared with its state when the session
        started (``available`` false, with a ``reason``, when it cannot be)."""
        return service.diff(session_id)

    @api.get("/v1/sessions/{session_id}/actions")
    def actions(session_id: str) -> dict[str, Any]:
        """Every action in log order: who asked it, each attempt with its sandbox epoch,
        the sandbox process that ran it, its outcome and why (docs/audit.md)."""
        from ..client.audit import audit_json
        from .service import mask

        service.session(session_id)  # a known session; its secrets learned, to mask with
        return {"actions": mask(audit_json(service.store.read(session_id)))}

    @api.get("/v1/sessions/{session_id}/events/stream")
    async def stream(request: Request, session_id: str, after: int = After,
                     until_settled: bool = False,
                     last_event_id: str | None = Header(default=None)) -> Response:
        """Server-Sent Events: every event with seq > ``Last-Event-ID`` (else ``after``),
        then each new one, each with ``id: <seq>``; ``event: end`` closes it."""
        start = _resume_point(last_event_id, after)
        session = await asyncio.to_thread(service.session, session_id)
        sub = streams.subscribe(session, start, until_settled, asyncio.get_running_loop())
        if sub is None:
            return _too_many(streams)
        return StreamingResponse(sse_lines(sub), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store",
                                          "X-Accel-Buffering": "no"})

    @api.websocket("/v1/sessions/{session_id}/events/ws")
    async def stream_ws(ws: WebSocket, session_id: str, after: int = 0,
                        until_settled: bool = False) -> None:
        """The same stream over a WebSocket: ``{"type": "event", "seq", "event"}``
        messages, then ``{"type": "end", "reason", "after"}`` and a close."""
        try:
            session = await asyncio.to_thread(service.session, session_id)
        except TrouperError as exc:
            await ws.send_denial_response(_trouper_error(exc))
            return
        if not 0 <= after <= INT64_MAX:
            await ws.send_denial_response(error(422, "invalid", "after: a seq, 0 to 2**63-1",
                                                "after"))
            return
        sub = streams.subscribe(session, after, until_settled, asyncio.get_running_loop())
        if sub is None:
            await ws.send_denial_response(_too_many(streams))
            return
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        await _serve_ws(ws, sub)

    from ..observability.exposition import daemon_route  # docs/operations.md, "Metrics"
    api.get("/metrics", include_in_schema=False)(daemon_route(service, streams, member))

    for path, (name, media) in PAGE_FILES.items():
        api.get(path, include_in_schema=False)(_page(name, media))

    http = http or http_limits()
    sized = RequestLimits(api, max_body_bytes=http.max_body_bytes,
                          max_header_bytes=http.max_header_bytes, error_body=limit_error_body)
    guarded = Guard(sized, token=token, hosts=hosts)
    guarded.fastapi = api  # type: ignore[attr-defined]
    return guarded


def _resume_point(last_event_id: str | None, after: int) -> int:
    """Where a stream starts: Last-Event-ID (a browser's reconnect) wins over ``after``."""
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 19
                and int(text) <= INT64_MAX):
            raise ConfigError("Last-Event-ID: must be a seq (a whole number)",
                              field="Last-Event-ID")
        return int(last_event_id.strip())
    if after < 0:
        raise ConfigError("after: must not be negative", field="after")
    return after


def _too_many(streams: Streams) -> JSONResponse:
    return error(429, "too_many_streams",
                 f"{streams.limits.max_streams} streams are open; retry later",
                 headers={"Retry-After": "1"})


async def _serve_ws(ws: WebSocket, sub: Any) -> None:
    """Send until the stream ends or the client goes; the session never notices either."""
    sender = asyncio.create_task(ws_send_loop(sub, ws.send_json))
    receiver = asyncio.create_task(_drain(ws))
    try:
        done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
        if sender in done and sender.exception() is None:
            end = sender.result()
            await ws.close(code=WS_CLOSE_CODES.get(end.reason, 1000),
                           reason=f"{end.reason}; resume after {end.after}")
    except (WebSocketDisconnect, RuntimeError, OSError) as exc:
        logger.debug("websocket of session %s ended: %s", sub.session.id, exc)
    finally:
        sender.cancel()
        receiver.cancel()
        sub.close()


async def _drain(ws: WebSocket) -> None:
    """Read (and ignore) what the client sends, to learn when it goes away."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return


def _page(name: str, media: str) -> Any:
    def page() -> Response:
        body = resources.files("trouper.daemon.page").joinpath(name).read_bytes()
        return Response(body, media_type=media, headers=_PAGE_HEADERS)
    page.__name__ = "page_" + name.replace(".", "_")
    return page
