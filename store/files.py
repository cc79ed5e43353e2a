"""The store's files are owner-only (I7 in docs/promises.md), whatever the process's umask."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from ..home.paths import private_dir

logger = logging.getLogger(__name__)

PRIVATE_MODE = 0o600
SIDE_FILES = ("-wal", "-shm", "-journal")
"""Files SQLite keeps beside the database; it gives them the database's mode."""


def make_private(path: Path) -> None:
    """Create the database file 0600 if missing (SQLite would use 0644 less the umask, and
    its WAL and SHM files copy the database's mode); tighten it and its side files if an
    older trouper or a copy left them readable by others.

    An existing file is never opened here, only stat'ed and chmod'ed by path: closing any
    descriptor on a file drops every POSIX lock this process holds on it, so a second store
    opened beside a live one would strip the first of its SQLite locks (and another
    process's writer could then overwrite its commits in the WAL).
    """
    if not path.parent.exists():
        private_dir(path.parent)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_MODE)
    except FileExistsError:
        pass
    else:
        os.close(fd)  # new: nobody in this process can hold a lock on it yet
    for side in (path, *(path.with_name(path.name + suffix) for suffix in SIDE_FILES)):
        _tighten(side)


def _tighten(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return  # missing: SQLite makes it with the database's mode
    if stat.S_ISLNK(info.st_mode):
        return  # chmod would follow it; the home is owner-only, so only its owner made it
    mode = stat.S_IMODE(info.st_mode)
    if not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return
    tight = mode & stat.S_IRWXU  # the owner's bits stay: a read-only store stays read-only
    try:
        os.chmod(path, tight)
    except PermissionError:  # another user's file: say so, and open it as before
        logger.warning("event store: %s is readable by others (%04o) and not ours to "
                       "tighten", path, mode)
    else:
        logger.warning("event store: tightened %s from %04o to %04o (owner-only)", path, mode,
                       tight)
