"""Causes that cross the layers as typed values: what happened to a sandbox.

A leaf module (it imports nothing of trouper's), so the runtimes and the messages can both
name the same causes without importing each other.
"""

from __future__ import annotations

from enum import StrEnum


class RuntimeFailure(StrEnum):
    """What happened to a sandbox or its proxy (``RuntimeFailed.cause``)."""

    NOT_STARTED = "not_started"
    """Nobody started it yet."""
    EXITED = "exited"
    """The server process is gone."""
    UNREACHABLE = "unreachable"
    """It runs but does not answer."""
    START_FAILED = "start_failed"
    """It could not be started or attached to."""
    SUPERSEDED = "superseded"
    """A newer proxy claimed it: this one must stand down."""
    FAILED = "failed"
    """Any other failure of a request to it."""
    OOM = "oom"
    """Its container was killed by the kernel for lack of memory."""
    REMOVED = "removed"
    """Its container was removed (``docker rm -f``) by someone else."""
    UNAUTHORIZED = "unauthorized"
    """A remote runtime server refused the credentials (a missing or wrong token)."""
    TIMED_OUT = "timed_out"
    """A request to it got no answer in time."""
    MISCONFIGURED = "misconfigured"
    """It cannot work as configured (an image missing or without ``sh``, a token the
    server refuses, a workspace it cannot use): never retried; fixed, then resumed."""
