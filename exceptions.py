"""trouper's exceptions.

    TrouperError
    ├── ConfigError            a configuration is invalid (bad model, bad limits); ``field``
    │   │                      names the field at fault
    │   └── MissingCredentials the model's provider needs an API key that nobody gave
    ├── UnknownSession         no session has that id
    ├── InvalidRequest         a request that cannot apply (wrong state, bad argument)
    ├── RequestTimeout         an actor did not answer in time (names the operation)
    ├── StoreError             the event store failed or holds something unexpected
    │   ├── LeaseLost          another Controller now owns the session's log
    │   └── StoreUnavailable   the store cannot be written now (disk full, read-only,
    │                          locked, corrupt, I/O error, its server unreachable): a
    │                          session state, not a crash
    └── RuntimeUnavailable     the sandbox is gone or does not answer (a supervisor acts)
        ├── StaleEpoch         the sandbox serves a newer proxy; this one must stop
        └── RuntimeMisconfigured  it cannot work as configured (no such image, a refused
                               token, an unusable workspace): never retried; names the fix

Errors the agent can act on (a failed command, a missing file) are never exceptions:
they are data in an ``Outcome``.
"""

from __future__ import annotations


class TrouperError(Exception):
    """Base of every error trouper raises on purpose."""


class ConfigError(TrouperError):
    """A configuration is invalid: refused before anything was created.

    The message reads ``field: reason`` (several problems are joined by ``; ``); ``field``
    is the first field at fault, as a dotted path (``"llm.model"``, ``"secrets.A-B"``),
    or None when no one field is to blame.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        return type(self), (str(self), self.field)


class MissingCredentials(ConfigError):
    """No API key for the model: none in the config, and the provider's environment
    variables (``names``) are not set. Raised by ``start_session``, and in the broker
    before a call (its environment is the one the actor system started with)."""

    def __init__(self, message: str, names: tuple[str, ...] = ()) -> None:
        super().__init__(message, field="llm.api_key")
        self.names = names

    def __reduce__(self) -> tuple[type, tuple[str, tuple[str, ...]]]:  # type: ignore[override]
        return type(self), (str(self), self.names)


class UnknownSession(TrouperError):
    """No session has that id."""


class InvalidRequest(TrouperError):
    """A request that cannot apply to the session as it is."""


class Conflict(InvalidRequest):
    """A create with a client-chosen id whose session was made by another request (the
    daemon's 409)."""


class RequestTimeout(TrouperError):
    """An actor did not answer within the deadline."""


class StoreError(TrouperError):
    """The event store failed or holds something unexpected."""


class LeaseLost(StoreError):
    """Another Controller has claimed the session; this one must stop writing."""


class StoreUnavailable(StoreError):
    """The store cannot take a write now; ``cause`` says why in words for the user.

    Nothing already recorded is lost; the write can be tried again once the cause is
    gone (space freed, permissions or mount fixed, the lock released, the server back).
    """

    def __init__(self, cause: str, kind: str = "io") -> None:
        super().__init__(cause)
        self.cause = cause
        self.kind = kind
        """``full``, ``read_only``, ``locked``, ``corrupt``, ``io``, or ``unreachable`` (a
        PostgreSQL store whose server does not answer)."""

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.cause, self.kind)


class RuntimeUnavailable(TrouperError):
    """The sandbox is gone or does not answer."""


class StaleEpoch(RuntimeUnavailable):
    """The sandbox has been claimed by a newer proxy incarnation."""


class RuntimeMisconfigured(RuntimeUnavailable):
    """The sandbox cannot work as it is configured, so trying again cannot help: an image
    that is not on the machine and cannot be pulled, or has no ``sh``; a runtime server
    that refuses the token or is not one; a workspace it cannot use. The message names
    the cause and the fix; the session waits in ERROR for the user to fix and resume."""


def class_path(exc: BaseException) -> str:
    """``module.Class`` of an exception, for carrying it across a process boundary."""
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"
