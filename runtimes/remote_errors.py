"""The remote runtime client's side of the failure table (``call_failures``, shared with
the local sandbox server's client): which of httpx's errors means no answer in time, and
the name the remote client's callers catch."""

from __future__ import annotations

from .call_failures import SandboxUnavailable
from .call_failures import unreachable as _unreachable

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
