"""Classify litellm's exceptions by type and status code (never by matching message text).

Only ``rate_limit`` and ``transient`` are worth a retry; the rest need a person or a
change (a bigger context, a valid key, a fixed request). Credentials come first among
those: a missing or refused key is ``auth`` whatever type litellm wrapped it in (a
missing OpenAI key arrives as a 500 ``InternalServerError``, which would otherwise be
retried as transient for a minute).
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import litellm
import openai

from ..exceptions import MissingCredentials
from ..messages.protocol import LLMErrorClass
from .headers import parse_duration_s

RETRYABLE: frozenset[str] = frozenset({"rate_limit", "transient"})

_TRANSIENT_STATUS = frozenset({408, 409, 500, 502, 503, 504, 529})
_AUTH_STATUS = frozenset({401, 403})
_CHAIN_DEPTH = 8


def classify(error: BaseException) -> LLMErrorClass:
    """The error class of an exception raised by ``litellm.completion``."""
    if isinstance(error, litellm.RateLimitError):
        return "rate_limit"
    if isinstance(error, litellm.ContextWindowExceededError):
        return "context_window"
    if is_auth_error(error):
        return "auth"
    if isinstance(
        error,
        litellm.Timeout
        | litellm.APIConnectionError
        | litellm.ServiceUnavailableError
        | litellm.BadGatewayError
        | litellm.InternalServerError,
    ):
        return "transient"
    if isinstance(error, litellm.APIResponseValidationError):
        return "malformed"
    if isinstance(error, litellm.BadRequestError | litellm.NotFoundError):
        return "bad_request"
    status = getattr(error, "status_code", None)
    if status in _TRANSIENT_STATUS:
        return "transient"
    if status == 429:
        return "rate_limit"
    return "unknown"


def is_auth_error(error: BaseException) -> bool:
    """The provider refused the credentials (401, 403), or there were none to send."""
    if isinstance(error, litellm.AuthenticationError | litellm.PermissionDeniedError
                  | MissingCredentials):
        return True
    if getattr(error, "status_code", None) in _AUTH_STATUS:
        return True
    return sdk_refused_to_start(error)


def sdk_refused_to_start(error: BaseException) -> bool:
    """The OpenAI SDK would not build a client: it raises its *base* ``OpenAIError`` only
    for its own configuration (no API key above all; every API failure is a subclass),
    and litellm wraps that in a 500. Found by type along the cause chain."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen and len(seen) < _CHAIN_DEPTH:
        if type(cause) is openai.OpenAIError:
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def response_headers(error: BaseException) -> dict[str, str]:
    """The provider's response headers carried by a litellm exception, lower-cased."""
    headers: Any = getattr(error, "litellm_response_headers", None)
    if headers is None:
        response = getattr(error, "response", None)
        headers = getattr(response, "headers", None)
    if not headers:
        return {}
    return {str(k).lower(): str(v) for k, v in dict(headers).items()}


def retry_after_s(error: BaseException, now: float | None = None) -> float | None:
    """What the provider asked us to wait: ``retry-after-ms``, ``retry-after`` (seconds or
    an HTTP date), or None when it said nothing."""
    headers = response_headers(error)
    if "retry-after-ms" in headers:
        try:
            return max(0.0, float(headers["retry-after-ms"]) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return _reset_s(headers)
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, parsed.timestamp() - (now if now is not None else time.time()))


def _reset_s(headers: dict[str, str]) -> float | None:
    """The longest of the ``x-ratelimit-reset-*`` durations, when the provider sent any."""
    resets = [
        parse_duration_s(headers[name])
        for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")
        if name in headers
    ]
    known = [r for r in resets if r is not None]
    return max(known) if known else None
