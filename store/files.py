"""The store's files are owner-only (I7), whatever the umask of the process opening it."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from ..paths import private_dir

logger = logging.getLogger(__name__)

PRIVATE_MODE = 0o600
SIDE_FILES = ("-wal", "-shm", "-journal")
"""Files SQLite keeps beside the database; it gives them the database's mode."""


def make_private(path: Path) -> None:
    """Create the database file 0600 if missing (SQLite would use 0644 less the umask, and
    its WAL and SHM files copy the database's mode); tighten it and its side files if an
    older trouper or a copy left them readable by others."""
    if not path.parent.exists():
        private_dir(path.parent)
    # read-only: a store on a read-only file still opens (its writes fail as a state)
    flags = os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC
    fd = os.open(path, flags, PRIVATE_MODE)
    try:
        _tighten(fd, path)
    finally:
        os.close(fd)
    for suffix in SIDE_FILES:
        side = path.with_name(path.name + suffix)
        try:
            fd = os.open(side, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # missing (or not ours to open): SQLite makes it with the db's mode
        try:
            _tighten(fd, side)
        finally:
            os.close(fd)


def _tighten(fd: int, path: Path) -> None:
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return
    tight = mode & stat.S_IRWXU  # the owner's bits stay: a read-only store stays read-only
    try:
        os.fchmod(fd, tight)
    except PermissionError:  # another user's file: say so, and open it as before
        logger.warning("event store: %s is readable by others (%04o) and not ours to "
                       "tighten", path, mode)
    else:
        logger.warning("event store: tightened %s from %04o to %04o (owner-only)", path, mode,
                       tight)
