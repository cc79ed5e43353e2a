"""Who owns what a root sandbox server makes in a workspace that belongs to someone else.

The sandbox server runs on the host; a Docker runtime's shell runs in a container as an
unprivileged uid that owns the workspace. When the server is root (as trouper is in CI,
or under a root daemon), a file or folder it makes there would be root's, and the shell
could not change it. So, when this process is root:

- a new file or folder takes the owner (uid:gid) of the folder it is made in;
- a file written over keeps the owner of the file it replaces;
- ``chown_tree`` hands a whole tree (a fresh clone, a workspace given to the sandbox's
  uid) to one owner.

Everything goes through descriptors: a symlink is never followed (``chown_tree`` changes
a symlink itself, never what it points to), a folder on another file system (a mount
inside the tree) is not entered, and a file with other hard links (which could be a file
outside the tree) is left alone. Not root: nothing here changes anything.
"""

from __future__ import annotations

import logging
import os
import stat

logger = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def numeric_ids(text: str) -> tuple[int, int]:
    """``(uid, gid)`` of ``"uid"`` (gid = uid) or ``"uid:gid"``; ValueError when it is not
    numeric (a name is looked up in an image, where it may be root) or is root's (uid or
    gid 0)."""
    uid, sep, gid = text.partition(":")
    if not _number(uid) or (sep and not _number(gid)):
        raise ValueError(f"{text!r} is not a numeric uid[:gid] (a name is looked up in the "
                         "image, where it may be root)")
    ids = int(uid), int(gid) if sep else int(uid)
    if 0 in ids:
        raise ValueError(f"{text!r} is root's (uid or gid 0): the sandbox never runs as root")
    if max(ids) >= 2**32 - 1:
        raise ValueError(f"{text!r} is past the largest uid/gid (4294967294)")
    return ids


def checked_user(text: str | None) -> str | None:
    """``text`` when it is None or a numeric ``uid[:gid]`` that is not root's (the check
    of ``DockerRuntime.user``); ValueError else."""
    if text is not None:
        numeric_ids(text)
    return text


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def acting_as_root() -> bool:
    """Whether this process may give files away (its effective uid is 0)."""
    return os.geteuid() == 0


def adopt_owner(fd: int, dir_fd: int, replaces: str | None = None) -> None:
    """When root: give the file open as ``fd`` (made in the folder ``dir_fd``) the owner of
    the regular file ``replaces`` it will be renamed over, or else the folder's owner."""
    if not acting_as_root():
        return
    info = None
    if replaces is not None:
        try:
            info = os.stat(replaces, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            info = None
        if info is not None and not stat.S_ISREG(info.st_mode):
            info = None
    if info is None:
        info = os.fstat(dir_fd)
    os.fchown(fd, info.st_uid, info.st_gid)


def chown_tree(path: str, uid: int, gid: int) -> tuple[int, int]:
    """Give ``path`` and everything below it to ``uid:gid`` (when root); returns how many
    entries were changed and how many were left alone (other hard links, other file
    systems). Symlinks are changed themselves, never followed."""
    if not acting_as_root():
        return 0, 0
    top = os.open(path, _DIR_FLAGS)
    device = os.fstat(top).st_dev
    changed, skipped = 1, 0
    os.fchown(top, uid, gid)
    stack = [(top, os.scandir(top))]
    try:
        while stack:
            dir_fd, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                os.close(dir_fd)
                stack.pop()
                continue
            child, done = _chown_entry(dir_fd, entry, uid, gid, device)
            changed, skipped = changed + done, skipped + (1 - done)
            if child is not None:
                stack.append((child, os.scandir(child)))
    finally:
        for dir_fd, entries in stack:
            entries.close()
            os.close(dir_fd)
    if skipped:
        logger.warning("%s: %d entries were not given to %d:%d (hard-linked files, or "
                       "another file system)", path, skipped, uid, gid)
    return changed, skipped


def _chown_entry(
    dir_fd: int, entry: os.DirEntry, uid: int, gid: int, device: int
) -> tuple[int | None, int]:
    """Chown one entry of ``dir_fd``; a folder's descriptor when it is to be entered, and
    1 if it was changed (0: left alone, or gone meanwhile)."""
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return None, 1
    if info.st_dev != device:
        return None, 0
    if stat.S_ISDIR(info.st_mode):
        try:
            child = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:  # replaced meanwhile (by a symlink, say): not entered
            return None, 0
        if os.fstat(child).st_ino != info.st_ino:
            os.close(child)
            return None, 0
        os.fchown(child, uid, gid)
        return child, 1
    if not stat.S_ISLNK(info.st_mode) and info.st_nlink > 1:
        return None, 0
    try:
        os.chown(entry.name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None, 1
    return None, 1
