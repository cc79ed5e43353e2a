"""trouper's sandbox server: a persistent shell and file tools behind a small HTTP API.

This package is stdlib-only and self-contained (it imports nothing outside itself), so
the same folder can be copied into a container or onto a remote host and started there
with any ``python3`` >= 3.8::

    python3 -m sandbox --state-dir /var/lib/trouper --workspace /work

The server journals every action by id where it runs, answers ``/execute`` idempotently,
fences stale callers by epoch, and outlives the process that started it (see server.py).
"""

from __future__ import annotations

PROTOCOL_VERSION = 1
"""Bumped when the HTTP API changes incompatibly."""
EXIT_LOCKED = 3
"""Exit status of a server that found another server holding its state folder."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest request body the server reads (413 past it); a client checks before sending."""
