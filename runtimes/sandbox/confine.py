"""From the agent's path to descriptors inside the workspace, with refusals worded for it.

``locate(workspace, path)`` normalises ``path`` by name (``..`` included) and refuses one
that leaves the workspace; then it opens the target's folder from a descriptor of the
workspace without following symlinks (``safefs``) and yields a ``Target``: that folder's
descriptor and the file's name in it. Everything after that is relative to descriptors.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from typing import Iterator

from . import safefs

_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class FileError(Exception):
    """A file action that cannot be done; the message is meant for the agent."""

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_
        """The OS error behind it, when there is one (``errno.ENOENT``: no such file)."""


class Target:
    """A file to act on: the descriptor of its folder and its name in that folder."""

    def __init__(self, root: str, path: str, parts: list[str], dir_fd: int) -> None:
        self.root = root
        """The workspace (as given)."""
        self.path = path
        """The path as the agent wrote it, for messages."""
        self.parts = parts
        self.name = parts[-1]
        self.dir_fd = dir_fd

    def open(self, flags: int, verb: str) -> int:
        """Open the file itself, never through a symlink (FileError for the agent)."""
        try:
            return os.open(self.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except OSError as e:
            if e.errno == errno.ENXIO:  # a socket, or a device without a driver
                raise self._not_regular() from e
            raise _refusal(e, self.root, self.path, self.parts, verb) from e

    def check_regular(self, info: os.stat_result) -> None:
        """Refuse anything but a regular file, by the ``fstat`` of an open descriptor."""
        if stat.S_ISDIR(info.st_mode):
            raise FileError(f"{self.path} is a directory, not a file (list it with: run ls).")
        if stat.S_ISLNK(info.st_mode):
            raise symlink_refusal(self.path, self.path, self.root)
        if not stat.S_ISREG(info.st_mode):
            raise not_regular(self.path, info.st_mode)

    def _not_regular(self) -> FileError:
        try:  # for the message only: which kind of file it is
            mode = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        return not_regular(self.path, mode)


def not_regular(path: str, mode: int) -> FileError:
    """The refusal of a FIFO, device, socket (or anything else not a regular file)."""
    kind = _KINDS.get(stat.S_IFMT(mode), "something")
    return FileError(
        f"{path} is {kind}, not a regular file: the file tools only read and write regular "
        "files (so they never block on a pipe or a device); use run for anything else."
    )


@contextmanager
def locate(workspace: str, path: str, create_mode: int | None = None) -> Iterator[Target]:
    """The ``Target`` of ``path``; with ``create_mode``, missing folders are made with it."""
    parts = relative_parts(workspace, path)
    if not parts:
        raise FileError(f"{path} is a directory, not a file (list it with: run ls).")
    try:
        root_fd = os.open(workspace, _ROOT_FLAGS)
    except OSError as e:
        raise FileError(f"Cannot open the workspace {workspace}: {e.strerror or e}.") from e
    try:
        try:
            dir_fd = safefs.open_dirs(root_fd, parts[:-1], create_mode)
        except OSError as e:
            raise _refusal(e, workspace, path, parts, "use") from e
    finally:
        os.close(root_fd)
    try:
        yield Target(workspace, path, parts, dir_fd)
    finally:
        os.close(dir_fd)


def relative_parts(workspace: str, path: str) -> list[str]:
    """``path``'s components below ``workspace``, ``..`` resolved by name; FileError when
    it is empty, holds a NUL byte, or leaves the workspace."""
    if not path or "\x00" in path:
        raise FileError(f"Invalid path {path!r}: it must be a non-empty path without NUL bytes.")
    if os.path.isabs(path):
        norm = os.path.normpath(path)
        bases = (os.path.normpath(os.path.abspath(workspace)), os.path.realpath(workspace))
        inside = [base for base in bases if _inside(norm, base)]
        if not inside:
            raise _outside(path, workspace)
        rel = os.path.relpath(norm, inside[0])
    else:
        rel = os.path.normpath(path)
    if rel == ".." or rel.startswith("../"):
        raise _outside(path, workspace)
    return [] if rel == "." else rel.split("/")


def symlink_refusal(path: str, link: str, root: str) -> FileError:
    """The refusal of a path that goes through the symlink ``link`` (workspace-relative)."""
    try:
        points = f" -> {os.readlink(os.path.join(root, link))}"
    except OSError:
        points = ""
    return FileError(
        f"{path} goes through a symlink ({link}{points}): the file tools never follow "
        "symlinks, even ones that stay inside the workspace, so that no path can lead "
        "outside it. Use the real path, or run (cat, cp) to go through the link.",
        errno.ELOOP,
    )


def _refusal(e: OSError, root: str, path: str, parts: list[str], verb: str) -> FileError:
    """``e`` (from opening ``parts``) worded for the agent."""
    code = e.errno
    if code in (errno.ELOOP, errno.ENOTDIR):
        link = safefs.first_symlink(root, parts)
        if link is not None or code == errno.ELOOP:
            return symlink_refusal(path, link or path, root)
        return FileError(f"Cannot {verb} {path}: a part of its path is a file, not a folder.",
                         code)
    if code == errno.ENOENT:
        return FileError(f"No such file: {path}.", code)
    if code == errno.EXDEV:
        return _outside(path, root)
    if code == errno.EISDIR:
        return FileError(f"{path} is a directory, not a file (list it with: run ls).", code)
    return FileError(f"Cannot {verb} {path}: {e.strerror or e}.", code)


def _outside(path: str, workspace: str) -> FileError:
    return FileError(
        f"Path {path!r} is outside the workspace {os.path.realpath(workspace)}: only files "
        "inside the workspace can be used."
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
