"""How a sandbox server's answers, and its silences, become trouper's exceptions: one table
for every sandbox client (the local sandbox server's, the remote runtime server's), each
failure a typed ``RuntimeFailure`` cause a supervisor can read.

    what happened                            raised                      cause
    409 (a newer epoch holds the sandbox)    StaleEpoch                  superseded
    400, 411, 413, 422                       InvalidRequest              -
    507                                      StoreUnavailable("full")    -
    401 or 403, or no token to send          SandboxUnavailable          unauthorized
    404 ``SandboxNotRunning``                SandboxUnavailable          exited
    any other status (its traceback kept)    SandboxUnavailable          failed
    200 that is not a JSON object            SandboxUnavailable          failed
    no connection: refused, reset, no route  SandboxUnavailable          unreachable
    no answer in time (a read timeout)       SandboxUnavailable          timed_out

``cause_of`` reads the cause back from any exception, for what reports a failure; a
``RuntimeMisconfigured`` (raised by a backend's start) reads ``misconfigured``.
"""

from __future__ import annotations

import json
from typing import Any

from ..exceptions import (
    InvalidRequest,
    RuntimeMisconfigured,
    RuntimeUnavailable,
    StaleEpoch,
    StoreUnavailable,
)
from ..messages.causes import RuntimeFailure

INVALID_STATUSES = frozenset({400, 411, 413, 422})
"""Answers that say the request itself was wrong (``InvalidRequest``)."""
_NOT_JSON = object()


class SandboxUnavailable(RuntimeUnavailable):
    """A sandbox's server cannot be used now; ``cause`` says why, as a typed value."""

    def __init__(self, message: str, cause: RuntimeFailure = RuntimeFailure.UNREACHABLE,
                 remote_traceback: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.cause = cause
        self.remote_traceback = remote_traceback
        """The server's traceback, when its answer carried one (a 500)."""
        self.status = status
        """The HTTP status of the answer; 0 when none came."""

    def __reduce__(self) -> tuple[type, tuple[str, RuntimeFailure, str, int]]:
        return type(self), (str(self), self.cause, self.remote_traceback, self.status)


def cause_of(error: BaseException | None) -> RuntimeFailure:
    """The cause an exception carries: its own typed ``cause``, ``misconfigured`` for a
    ``RuntimeMisconfigured``, ``superseded`` for a ``StaleEpoch``, ``unreachable`` for any
    other ``RuntimeUnavailable``, else ``failed``."""
    if isinstance(error, RuntimeMisconfigured):
        return RuntimeFailure.MISCONFIGURED
    cause = getattr(error, "cause", None)
    if isinstance(cause, RuntimeFailure):
        return cause
    if isinstance(error, StaleEpoch):
        return RuntimeFailure.SUPERSEDED
    if isinstance(error, RuntimeUnavailable):
        return RuntimeFailure.UNREACHABLE
    return RuntimeFailure.FAILED


def unreachable(where: str, operation: str, error: BaseException, *,
                timed_out: bool) -> SandboxUnavailable:
    """A transport error: no answer at all (``timed_out`` when the connection was made and
    the answer did not come in time; each transport knows which of its errors that is)."""
    return SandboxUnavailable(
        f"{operation}: cannot reach {where}: {type(error).__name__}: {error}",
        RuntimeFailure.TIMED_OUT if timed_out else RuntimeFailure.UNREACHABLE)


def bad_answer(where: str, operation: str, what: str, status: int = 0) -> SandboxUnavailable:
    """An answer that makes no sense (not JSON, a record without its fields)."""
    return SandboxUnavailable(f"{operation}: {where} {what}", RuntimeFailure.FAILED,
                              status=status)


def answer_json(where: str, operation: str, status: int, payload: bytes) -> dict[str, Any]:
    """The JSON object of an answer: a 200's, or the exception its status maps to."""
    if status != 200:
        raise refusal(where, operation, status, payload)
    answer = _json(payload)
    if not isinstance(answer, dict):
        what = "with non-JSON" if answer is _NOT_JSON else f"{answer!r:.200}"
        raise bad_answer(where, operation, f"answered {status} {what}", status)
    return answer


def refusal(where: str, operation: str, status: int, payload: bytes) -> Exception:
    """The exception for an answer other than 200 (see the table above)."""
    answer = _json(payload)
    answer = answer if isinstance(answer, dict) else {}
    code = str(answer.get("error", "Error"))
    message = str(answer.get("message", payload[:500].decode("utf-8", "replace")))
    text = f"{operation}: {where} answered {status} {code}: {message}"
    if status == 409:
        return StaleEpoch(text)
    if status in INVALID_STATUSES:
        return InvalidRequest(text)
    if status == 507:
        return StoreUnavailable(message or text, "full")
    if status in (401, 403):
        return SandboxUnavailable(text + " (a missing or wrong token)",
                                  RuntimeFailure.UNAUTHORIZED, status=status)
    if status == 404 and code == "SandboxNotRunning":
        return SandboxUnavailable(text, RuntimeFailure.EXITED, status=status)
    return SandboxUnavailable(text, RuntimeFailure.FAILED, str(answer.get("traceback", "")),
                              status)


def _json(payload: bytes) -> Any:
    """The decoded JSON of ``payload``, or ``_NOT_JSON``."""
    try:
        return json.loads(payload.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one too
        return _NOT_JSON
