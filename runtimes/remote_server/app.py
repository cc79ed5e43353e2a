"""The runtime server's HTTP API (FastAPI), under ``/v1``; every route needs the token.

    GET  /v1/health                                  -> {ok, protocol, boot_id, pid, sessions}
    POST /v1/sessions/{sid}/start   {epoch | "next", env, secret_names, max_output_chars}
         -> {epoch, attached, running, boot_id, shell_pid, workspace}   409 if epoch is older
    GET  /v1/sessions/{sid}/health                   -> {running, epoch, boot_id, shell_pid}
    POST /v1/sessions/{sid}/stop    {epoch}          -> {stopped}
    POST /v1/sessions/{sid}/crash                    -> {killed}  (fault injection)
    POST /v1/sessions/{sid}/actions {action_id, epoch, action, timeout_s,
                                     no_output_timeout_s, wait_s}
         -> the journal record; journaled and started once per action id, then long-polled
            up to wait_s (at most MAX_WAIT_S): a repeat returns the same record
    GET  /v1/sessions/{sid}/actions/{aid}?wait_s=&epoch=          -> the record (long-poll)
    GET  /v1/sessions/{sid}/actions/{aid}/output?offset=&limit=&epoch=
         -> {data, offset, next_offset, state}: the output (masked) from a byte offset
    PUT  /v1/sessions/{sid}/files?path=&epoch=   (raw body)       -> {path, size}
    POST /v1/sessions/{sid}/restore {from_session, checkpoint}    -> {restored, skipped}
         a session not started yet gets another's checkpoint as its workspace (a fork)
    GET  /v1/sessions/{sid}/files?path=&epoch=                    -> the file's bytes

A record is ``{action_id, state, epoch, outcome}``, state absent / running / finished /
unknown. Errors are ``{"error": <code>, "message": ...}``: 400 BadRequest or PathRefused,
401 Unauthorized, 404 NotFound or SandboxNotRunning, 409 StaleEpoch, 413
PayloadTooLarge, 422 InvalidRequest, 431 HeadersTooLarge, 503 TooManyConnections,
507 StorageUnavailable; 500 InternalError is a bug (tests/test_remote_fuzz.py walks every
route with hostile input and expects none). Ids and numbers are checked before they
reach a file: an action id is 1-200 characters, every integer (a query's or a body's) fits
in 64 bits, every number is finite, and a body's lone surrogates become U+FFFD (I6 in
docs/promises.md).
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ...messages.text import storable
from ...serving.limits import INT64_MAX
from ..sandbox import MAX_BODY_BYTES, PROTOCOL_VERSION
from ..sandbox.confine import FileError
from ..sandbox.service import BadRequest, StaleEpoch, StorageUnavailable
from . import workfiles
from .guard import MAX_HEADER_BYTES, Guard
from .registry import Hosted, NotRunning, Sessions

logger = logging.getLogger(__name__)

MAX_WAIT_S = 30.0
"""Longest long-poll one request may ask for: a long command is started, then polled."""
MAX_OUTPUT_CHUNK = 1024 * 1024
"""Most bytes of output one request returns."""
THREADS = 256
"""Worker threads for blocking routes (each long-poll holds one)."""
ActionId = Path(min_length=1, max_length=200)
"""An action id as ``/actions`` takes one (it names a journal file)."""
Epoch = Query(None, ge=0, le=INT64_MAX)

_ERRORS: list[tuple[type[BaseException], int, str]] = [
    (StaleEpoch, 409, "StaleEpoch"),
    (BadRequest, 400, "BadRequest"),
    (FileError, 400, "PathRefused"),
    (NotRunning, 404, "SandboxNotRunning"),
    (StorageUnavailable, 507, "StorageUnavailable"),
]


def create_app(sessions: Sessions, token: str, max_body_bytes: int = MAX_BODY_BYTES,
               max_header_bytes: int = MAX_HEADER_BYTES) -> Guard:
    """The ASGI app: ``Guard`` (token, sizes) around the FastAPI routes.

    ``guard.app`` is the FastAPI app (its ``routes`` list every endpoint).
    """
    app = FastAPI(title="trouper runtime server", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=_lifespan)
    _errors(app)
    _routes(app, sessions)
    return Guard(app, token, max_body_bytes, max_header_bytes)


async def _lifespan(app: FastAPI) -> Any:
    import anyio.to_thread

    anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS
    yield


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def _errors(app: FastAPI) -> None:
    for exc_type, status, code in _ERRORS:
        def handler(request: Request, exc: Exception, status: int = status,
                    code: str = code) -> JSONResponse:
            return _error(status, code, str(exc))

        app.add_exception_handler(exc_type, handler)

    def invalid(request: Request, exc: Exception) -> JSONResponse:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        text = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}"
                         for e in errors)
        return _error(422, "InvalidRequest", text or str(exc))

    def http_error(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        code = "NotFound" if status == 404 else "MethodNotAllowed" if status == 405 else "HTTP"
        return _error(status, code, f"{request.method} {request.url.path}: {exc}")

    def gone(request: Request, exc: Exception) -> Response:
        # the client left, or its body was cut at the limit (it has its 413): no one reads
        # this answer, and it is no failure of the server's
        logger.debug("%s %s: the client went away", request.method, request.url.path)
        return Response(status_code=400)

    def internal(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("%s %s failed", request.method, request.url.path)
        return _error(500, "InternalError", f"{type(exc).__name__}: {exc}")

    app.add_exception_handler(ClientDisconnect, gone)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal)


def _routes(app: FastAPI, sessions: Sessions) -> None:  # noqa: C901 - one place lists them
    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "protocol": PROTOCOL_VERSION, "boot_id": sessions.boot_id,
                "pid": os.getpid(), "sessions": sessions.count()}

    @app.post("/v1/sessions/{session_id}/start")
    def start(session_id: str, body: dict[str, Any] = Depends(_json_body)) -> dict[str, Any]:
        env = body.get("env") or {}
        names = body.get("secret_names") or []
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and k and not set(k) & {"=", "\0"} and isinstance(v, str)
                and "\0" not in v for k, v in env.items()):
            raise BadRequest("env must map variable names (without '=' or NUL) to strings "
                             "without NUL")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("secret_names must be a list of names")
        chars = body.get("max_output_chars")
        if chars is not None and (type(chars) is not int or chars <= 0):
            raise BadRequest("max_output_chars must be a positive integer")
        return sessions.start(session_id, body.get("epoch", "next"), env, names, chars)

    @app.get("/v1/sessions/{session_id}/health")
    def session_health(session_id: str) -> dict[str, Any]:
        return sessions.health(session_id)

    @app.post("/v1/sessions/{session_id}/stop")
    def stop(session_id: str, body: dict[str, Any] = Depends(_json_body)) -> dict[str, Any]:
        return {"stopped": sessions.stop(session_id, body.get("epoch"))}

    @app.post("/v1/sessions/{session_id}/crash")
    def crash(session_id: str) -> dict[str, Any]:
        return {"killed": sessions.crash(session_id)}

    @app.post("/v1/sessions/{session_id}/actions")
    def execute(session_id: str, body: dict[str, Any] = Depends(_json_body)) -> dict[str, Any]:
        hosted = sessions.get(session_id)
        wait_s = _wait(body.get("wait_s", 0.0))
        with _busy(hosted):
            record = hosted.service.execute(body)
            if record["state"] == "running" and wait_s > 0:
                record = _checked(hosted, hosted.journal.wait(record["action_id"], wait_s))
        return record

    @app.get("/v1/sessions/{session_id}/actions/{action_id}")
    def action(session_id: str, action_id: str = ActionId, wait_s: float = 0.0,
               epoch: int | None = Epoch) -> dict[str, Any]:
        hosted = sessions.get(session_id)
        hosted.service.check_epoch(epoch)
        with _busy(hosted):
            return _checked(hosted, hosted.journal.wait(action_id, _wait(wait_s)))

    @app.get("/v1/sessions/{session_id}/actions/{action_id}/output")
    def output(session_id: str, action_id: str = ActionId,
               offset: int = Query(0, ge=0, le=INT64_MAX),
               limit: int = Query(MAX_OUTPUT_CHUNK, gt=0, le=INT64_MAX),
               epoch: int | None = Epoch) -> dict[str, Any]:
        hosted = sessions.get(session_id)
        hosted.service.check_epoch(epoch)
        state = hosted.journal.read(action_id)["state"]
        path = hosted.journal.output_path(action_id)
        data, next_offset = workfiles.read_text_chunk(path, offset, min(limit, MAX_OUTPUT_CHUNK))
        return {"action_id": action_id, "state": state, "offset": offset,
                "next_offset": next_offset, "data": data}

    @app.put("/v1/sessions/{session_id}/files")
    async def upload(session_id: str, request: Request, path: str,
                     epoch: int | None = Epoch) -> dict[str, Any]:
        hosted = sessions.get(session_id)
        hosted.service.check_epoch(epoch)
        data = await request.body()
        size = await run_in_threadpool(workfiles.upload, hosted.service.workspace, path, data,
                                       sessions.shell_umask)
        return {"path": path, "size": size}

    @app.post("/v1/sessions/{session_id}/restore")
    def restore(session_id: str, body: dict[str, Any] = Depends(_json_body)) -> dict[str, Any]:
        return sessions.restore(session_id, body.get("from_session"), body.get("checkpoint"))

    @app.get("/v1/sessions/{session_id}/files")
    def download(session_id: str, path: str, epoch: int | None = Epoch) -> Response:
        hosted = sessions.get(session_id)
        hosted.service.check_epoch(epoch)
        data = workfiles.download(hosted.service.workspace, path, MAX_BODY_BYTES)
        return Response(data, media_type="application/octet-stream")


async def _json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object, whatever its content type says; ``{}`` when empty.
    Integers fit in 64 bits, numbers are finite (no ``NaN``), and lone surrogates in its
    strings become U+FFFD, so nothing in it fails later on a file, a clock or a shell."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = storable(json.loads(raw, parse_int=_int64, parse_float=_finite,
                                   parse_constant=_no_constant))
    except RecursionError as e:
        raise BadRequest("the body is nested too deeply") from e
    except ValueError as e:
        raise BadRequest(f"the body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _int64(text: str) -> int:
    value = int(text)
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"the integer {text[:30]}... does not fit in 64 bits")
    return value


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:30]} is too large")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")


def _wait(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise BadRequest("wait_s must be a finite number >= 0")
    return min(MAX_WAIT_S, float(value))


def _checked(hosted: Hosted, record: dict[str, Any]) -> dict[str, Any]:
    """``record``, unless the sandbox was crashed while it was waited for."""
    if hosted.dead and record["state"] == "running":
        raise NotRunning(f"session {hosted.session_id}: the sandbox crashed while "
                         f"{record['action_id']} was running")
    return record


class _busy:  # noqa: N801 - used as a statement
    def __init__(self, hosted: Hosted) -> None:
        self.hosted = hosted

    def __enter__(self) -> None:
        self.hosted.enter()

    def __exit__(self, *exc: object) -> None:
        self.hosted.leave()
