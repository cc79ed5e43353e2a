"""The daemon's files in a trouper home, and who holds them.

    <home>/daemon.lock   an fcntl (POSIX) lock held by the daemon process while it runs
    <home>/daemon.pid    its pid
    <home>/daemon.json   {"url", "pid", "host", "port", "started_at"} (0600)
    <home>/token         the bearer token clients send (0600), made at the first start
    <home>/logs/daemon.log  the daemon's log (its stdout and stderr too)

The lock is a POSIX record lock (``fcntl.lockf``), which a forked process does not
inherit: the actor processes the daemon forks never hold it, so it is free the instant the
daemon process is gone, even killed, while its actors are still being ended. Light on
purpose (no FastAPI, no actor system): the CLI and the client read these.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..home.paths import FILE_MODE, Home, private_dir, write_private

LOCK_NAME, PID_NAME, INFO_NAME, TOKEN_NAME = "daemon.lock", "daemon.pid", "daemon.json", "token"
LOG_NAME = "daemon.log"


@dataclass(frozen=True)
class DaemonFiles:
    """The daemon's paths under one home."""

    home: Home

    @property
    def lock(self) -> Path:
        return self.home.root / LOCK_NAME

    @property
    def pid(self) -> Path:
        return self.home.root / PID_NAME

    @property
    def info(self) -> Path:
        return self.home.root / INFO_NAME

    @property
    def token(self) -> Path:
        return self.home.root / TOKEN_NAME

    @property
    def log(self) -> Path:
        return self.home.root / "logs" / LOG_NAME


def ensure_token(files: DaemonFiles) -> str:
    """The home's token, made (random, 256 bits, 0600) if it has none yet."""
    existing = read_token(files)
    if existing:
        return existing
    token = secrets.token_urlsafe(32)
    private_dir(files.token.parent)
    try:
        fd = os.open(files.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                     | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:  # another process made it meanwhile: theirs stands
        return read_token(files) or token
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), FILE_MODE)
        out.write(token + "\n")
    return token


def read_token(files: DaemonFiles) -> str | None:
    """The token in the home, or None when there is none (or it is empty)."""
    try:
        fd = os.open(files.token, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as handle:
        if os.fstat(handle.fileno()).st_mode & 0o077:
            os.fchmod(handle.fileno(), FILE_MODE)  # copied with loose modes: tighten
        return handle.read().strip() or None


class HomeLock:
    """The daemon's lock on a home: at most one daemon process holds it at a time."""

    def __init__(self, files: DaemonFiles) -> None:
        self.files = files
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it. Never blocks."""
        private_dir(self.files.lock.parent)
        fd = os.open(self.files.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the descriptor releases the POSIX lock


def lock_is_held(files: DaemonFiles) -> bool:
    """Whether a daemon process holds the home's lock now (tested without taking it)."""
    try:
        fd = os.open(files.lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        # F_GETLK through lockf's cousin: try, and give it back at once if we got it
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return True
            raise
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def write_running(files: DaemonFiles, info: dict[str, Any]) -> None:
    """Publish the running daemon: its pid and its daemon.json (both 0600)."""
    write_private(files.pid, f"{info['pid']}\n")
    write_private(files.info, json.dumps(info, indent=2) + "\n")


def clear_running(files: DaemonFiles) -> None:
    for path in (files.info, files.pid):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def running_info(files: DaemonFiles) -> dict[str, Any] | None:
    """daemon.json of the daemon running for the home, or None when none runs (a file a
    killed daemon left behind is ignored: nobody holds the lock)."""
    if not lock_is_held(files):
        return None
    try:
        info = json.loads(files.info.read_text())
    except (OSError, ValueError):
        return None  # starting: locked, not yet published
    return info if isinstance(info, dict) else None
