"""The remote runtime client's side of the failure table (``call_failures``, shared with
the local sandbox server's client): which of httpx's errors means no answer in time, the
name the remote client's callers catch, and which answers to the first health check say
the runtime is misconfigured (a refused token, a server that is not a runtime server, a
certificate not trusted), so that no restart tries it again."""

from __future__ import annotations

import ssl
from typing import Any

from ..exceptions import RuntimeMisconfigured
from ..messages.causes import RuntimeFailure
from .call_failures import SandboxUnavailable
from .call_failures import unreachable as _unreachable

NOT_A_SERVER_STATUS = frozenset({400, 404, 405, 406, 410, 415, 501})
"""Answers to ``GET /v1/health`` that no runtime server (nor a proxy in front of one that
is restarting: 502, 503, 504) gives: another server is there, or another scheme."""

RemoteUnavailable = SandboxUnavailable
"""The runtime server cannot be used now; ``cause`` says why, as a typed value (the one
exception both sandbox clients raise, under the name this client has always used)."""


def unreachable(where: str, operation: str, error: Exception) -> SandboxUnavailable:
    """A transport error of httpx's: unreachable, refused or reset, or (a timeout once
    connected) timed out."""
    import httpx

    timed_out = isinstance(error, httpx.TimeoutException) and not isinstance(
        error, httpx.ConnectTimeout)
    return _unreachable(where, operation, error, timed_out=timed_out)


def refused_at_start(url: str, token_env: str, has_token: bool,
                     error: SandboxUnavailable) -> RuntimeMisconfigured | None:
    """What a refused first health check means, when it is the configuration's fault:
    no token or a wrong one (401, 403), a URL where no runtime server answers
    (``NOT_A_SERVER_STATUS``, or a 200 that is not its JSON), a certificate this machine
    does not trust. None: a fault that may heal (unreachable, timed out, 500, 502, 503,
    504)."""
    fix_token = (f"set ${token_env} to the token in the server's --token-file (or give "
                 "RemoteRuntime(token=...)), then resume")
    if error.cause == RuntimeFailure.UNAUTHORIZED:
        if not has_token:
            return RuntimeMisconfigured(f"no token for the runtime server at {url}: "
                                        f"{fix_token}")
        return RuntimeMisconfigured(f"the runtime server at {url} refused the token "
                                    f"({error}): {fix_token}")
    if error.status in NOT_A_SERVER_STATUS or error.status == 200:
        return not_a_runtime_server(url, str(error))
    if _caused_by(error, ssl.SSLCertVerificationError):
        return RuntimeMisconfigured(
            f"the runtime server at {url} has a certificate this machine does not trust "
            f"({error}): give its certificate (or its CA's) as RemoteRuntime(verify="
            "'cert.pem'), or serve it with one this machine trusts; then resume")
    return None


def _caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    """Whether an exception of ``kind`` is in ``error``'s chain (causes and contexts)."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen and len(seen) < 8:
        if isinstance(cause, kind):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def not_a_runtime_server(url: str, what: str) -> RuntimeMisconfigured:
    """``url`` answers, but not as ``trouper runtime-server`` does."""
    return RuntimeMisconfigured(
        f"{url} is not a trouper runtime server ({what}): check --url (or RemoteRuntime(url=)"
        "); `trouper runtime-server` prints the address it serves when it starts")


def checked_health(url: str, answer: dict[str, Any]) -> None:
    """Raise ``RuntimeMisconfigured`` unless ``answer`` is a runtime server's health."""
    if answer.get("ok") is not True or not isinstance(answer.get("protocol"), int):
        shown = ", ".join(sorted(map(str, answer)))[:200]
        raise not_a_runtime_server(url, f"GET /v1/health answered a JSON object with "
                                        f"{shown or 'no fields'}")
