"""Storage faults in words: which failed writes are a session state, and what to tell.

A write that fails because of where the store lives (the disk is full, the file or its
mount is read-only, another process holds the lock past the busy timeout, the file is
corrupt, the disk fails) is not a bug to crash on: it becomes ``StoreUnavailable`` with a
cause a user can act on, the session waits in ERROR, and it carries on once a write goes
through again (promise I6, docs/promises.md).
"""

from __future__ import annotations

import errno
import sqlite3

from ..exceptions import StoreUnavailable

_SQLITE = {
    "SQLITE_FULL": ("full", "the disk holding the home is full"),
    "SQLITE_READONLY": ("read_only", "the store is read-only (check the permissions of "
                                     "trouper.db and its folder, and whether the disk is "
                                     "mounted read-only)"),
    "SQLITE_BUSY": ("locked", "the store is locked by another process"),
    "SQLITE_LOCKED": ("locked", "the store is locked by another process"),
    "SQLITE_CORRUPT": ("corrupt", "the store's file is corrupt"),
    "SQLITE_NOTADB": ("corrupt", "the store's file is not a database"),
    "SQLITE_IOERR": ("io", "the disk holding the home failed a write (I/O error)"),
    "SQLITE_CANTOPEN": ("io", "the store's file cannot be opened"),
}
_ERRNO = {
    errno.ENOSPC: ("full", "the disk holding the home is full"),
    errno.EDQUOT: ("full", "the disk quota of the home is used up"),
    errno.EROFS: ("read_only", "the disk holding the home is mounted read-only"),
    errno.EACCES: ("read_only", "the home is not writable (permission denied)"),
    errno.EPERM: ("read_only", "the home is not writable (operation not permitted)"),
    errno.EIO: ("io", "the disk holding the home failed a write (I/O error)"),
}


def storage_fault(exc: BaseException) -> StoreUnavailable | None:
    """The ``StoreUnavailable`` a failed write amounts to, or None if it is something else."""
    if isinstance(exc, StoreUnavailable):
        return exc
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or ""
        base = name.split("_")[0:2]
        for key in (name, "_".join(base)):
            if key in _SQLITE:
                kind, cause = _SQLITE[key]
                return StoreUnavailable(f"{cause} ({exc})", kind)
        text = str(exc).lower()
        if "disk is full" in text:
            return StoreUnavailable(f"{_SQLITE['SQLITE_FULL'][1]} ({exc})", "full")
        if "readonly" in text or "read-only" in text:
            return StoreUnavailable(f"{_SQLITE['SQLITE_READONLY'][1]} ({exc})", "read_only")
        if "locked" in text:
            return StoreUnavailable(f"{_SQLITE['SQLITE_BUSY'][1]} ({exc})", "locked")
        return None
    if isinstance(exc, OSError) and exc.errno in _ERRNO:
        kind, cause = _ERRNO[exc.errno]
        return StoreUnavailable(f"{cause} ({exc.strerror or exc})", kind)
    return None
