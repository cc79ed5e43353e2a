"""What the daemon's HTTP answers mean to its Python client: an error answer as trouper's
exception, and how long a 503 asks to wait."""

from __future__ import annotations

import httpx

from ..exceptions import (
    ConfigError,
    InvalidRequest,
    RequestTimeout,
    TrouperError,
    UnknownSession,
)


class DaemonUnavailable(TrouperError):
    """No daemon answers at the url, or it refused this client (token, Host, Origin)."""


def error_of(answer: httpx.Response) -> TrouperError:
    """The exception for an error answer of the API."""
    try:
        body = answer.json().get("error") or {}
    except ValueError:
        body = {}
    message = str(body.get("message") or f"HTTP {answer.status_code}")
    status = answer.status_code
    if status == 404:
        return UnknownSession(message)
    if status == 422:
        return ConfigError(message, field=body.get("field"))
    if status == 409:
        return InvalidRequest(message)
    if status in (503, 504):
        return RequestTimeout(message)
    if status in (401, 403):
        return DaemonUnavailable(f"the daemon refused this client: {message}")
    return TrouperError(f"HTTP {status}: {message}")


def retry_after(answer: httpx.Response) -> float:
    """The wait a 503 asks for (``Retry-After`` in seconds), at least a tenth of one."""
    try:
        return max(0.1, float(answer.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0
