"""The store's ``append`` timed, without importing prometheus_client into every program
that opens a store (a CLI reading the log pays nothing): ``metrics.enable`` hands this
module the recorder, in the actor processes only."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

observe_append: list[Callable[[str, float], None]] = []
"""The recorder of this process (``metrics.enable`` sets it); empty: nothing is timed."""


def timed_append(backend: str) -> Callable[[F], F]:
    """Decorate a store's ``append``: a successful one's seconds are observed as
    ``trouper_store_append_seconds{backend}``; a failed one is not (it raised)."""
    def decorate(append: F) -> F:
        @functools.wraps(append)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            stored = append(*args, **kwargs)
            if observe_append:
                observe_append[0](backend, time.perf_counter() - started)
            return stored
        return timed  # type: ignore[return-value]
    return decorate
