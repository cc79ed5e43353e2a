"""How the remote runtime client reports trouble: HTTP answers and transport errors mapped
onto trouper's exceptions, with a typed ``RuntimeFailure`` cause for the supervisor."""

from __future__ import annotations

from typing import Any

from ..exceptions import InvalidRequest, RuntimeUnavailable, StaleEpoch, StoreUnavailable
from ..messages.causes import RuntimeFailure


class RemoteUnavailable(RuntimeUnavailable):
    """The runtime server cannot be used now; ``cause`` says why, as a typed value."""

    def __init__(self, message: str, cause: RuntimeFailure = RuntimeFailure.UNREACHABLE) -> None:
        super().__init__(message)
        self.cause = cause

    def __reduce__(self) -> tuple[type, tuple[str, RuntimeFailure]]:
        return type(self), (str(self), self.cause)


def unreachable(url: str, operation: str, error: Exception) -> RemoteUnavailable:
    """A transport error (httpx's): unreachable, refused, reset, or timed out."""
    import httpx

    cause = RuntimeFailure.UNREACHABLE
    if isinstance(error, httpx.TimeoutException) and not isinstance(
            error, httpx.ConnectTimeout):
        cause = RuntimeFailure.TIMED_OUT
    return RemoteUnavailable(f"{operation}: cannot reach the runtime server at {url}: "
                             f"{type(error).__name__}: {error}", cause)


def refusal(url: str, response: Any, operation: str) -> Exception:
    """The exception for a non-200 answer: 409 StaleEpoch, 400/413/422 InvalidRequest,
    507 StoreUnavailable, anything else RemoteUnavailable with its cause."""
    status = response.status_code
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    answer = answer if isinstance(answer, dict) else {}
    code, message = answer.get("error", "Error"), answer.get("message", response.text[:500])
    text = f"{operation}: the runtime server at {url} answered {status} {code}: {message}"
    if status == 409:
        return StaleEpoch(text)
    if status in (400, 413, 422):
        return InvalidRequest(text)
    if status == 507:
        return StoreUnavailable(message or text, "full")
    if status == 401:
        return RemoteUnavailable(text + " (check the runtime's token)",
                                 RuntimeFailure.UNAUTHORIZED)
    if status == 404 and code == "SandboxNotRunning":
        return RemoteUnavailable(text, RuntimeFailure.EXITED)
    return RemoteUnavailable(text, RuntimeFailure.FAILED)
