"""Small helpers shared by the sandbox modules: safe file names, owner-only folders and
atomic JSON files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
from typing import Any, Iterable

PRIVATE_DIR_MODE = 0o700
"""Folders of the state folder (and it): the owner only."""
PRIVATE_FILE_MODE = 0o600
"""Files of the state folder: journal records, outputs, server.json, lock, log."""
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def safe_name(action_id: str) -> str:
    """A file name for ``action_id``: itself when harmless, else a hash of it."""
    if _SAFE_NAME.match(action_id):
        return action_id
    return "h-" + hashlib.sha256(action_id.encode("utf-8")).hexdigest()[:40]


def write_json_atomic(path: str, data: Any, mode: int = 0o600, durable: bool = True) -> None:
    """Write ``data`` as JSON to ``path`` atomically, with exactly ``mode``: tmp file,
    rename; with ``durable``, fsync the file before the rename and the folder after it
    (survives a host crash). A temporary that cannot be written whole is removed."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        try:
            os.fchmod(fd, mode)  # a leftover tmp keeps its old mode; the umask masks a new one
            os.write(fd, json.dumps(data, sort_keys=True).encode("utf-8"))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(path) or ".")


def read_json_lines(path: str) -> dict[str, Any] | None:
    """The JSON objects of ``path``'s lines merged in order (a later line's keys win),
    skipping lines that do not parse; None when the file is missing or holds none."""
    try:
        with open(path, "rb") as f:
            return merge_json_lines(f.read().split(b"\n"))
    except OSError:
        return None


def merge_json_lines(lines: Iterable[bytes]) -> dict[str, Any] | None:
    """The JSON objects among ``lines`` merged in order (a later one's keys win); a line
    that is not one (cut short by a crash or a full disk) is skipped. None: there is none."""
    merged: dict[str, Any] | None = None
    for line in lines:
        try:
            value = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(value, dict):
            merged = {**(merged or {}), **value}
    return merged


def private_dir(path: str) -> str:
    """Create ``path`` (and missing parents) owner-only (0700), or make it so."""
    os.makedirs(path, mode=PRIVATE_DIR_MODE, exist_ok=True)
    os.chmod(path, PRIVATE_DIR_MODE)  # makedirs' mode is masked by the umask; be exact
    return path


def open_private(path: str, flags: int) -> int:
    """``os.open`` of a file of the state folder: created 0600, tightened if looser."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, PRIVATE_FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json(path: str) -> Any:
    """The JSON in ``path``, or None when it is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


def wall_time() -> str:
    """The current UTC time as ISO 8601 text."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
