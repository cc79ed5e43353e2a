"""Who a session's container runs as: never root, and someone who can write the workspace.

- ``DockerRuntime.user`` when given (numeric ``uid[:gid]``, never 0; gid defaults to the
  uid: Docker's own default, the image's passwd or else gid 0, could be root's group);
- else, when trouper is not root: the caller's uid:gid, so the agent's files are yours;
- else (trouper is root): the workspace owner's, when that is not root; when it is root, a
  dedicated unprivileged uid:gid (``TROUPER_SANDBOX_UID``, 65532 for both by default).

When trouper is root and the workspace (the folder itself) is root's, the tree is handed
to the container's user (chown, ``sandbox/owners.py``: never through a symlink, not into
another file system, hard-linked files left alone), so its shell can write it. A root
container would own the host: anything it made setuid in the bind mount runs as root for
any local user who reaches the folder.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from ..config.settings import settings
from .sandbox.owners import chown_tree, numeric_ids

logger = logging.getLogger(__name__)


def parse_user(text: str) -> tuple[int, int]:
    """``(uid, gid)`` of ``"uid"`` or ``"uid:gid"``; ValueError when it is not numeric or
    names root (uid or gid 0)."""
    return numeric_ids(text)


def choose_user(
    configured: str | None, workspace_owner: tuple[int, int], euid: int | None = None,
    ids: tuple[int, int] | None = None, dedicated: int | None = None,
) -> tuple[tuple[int, int], bool]:
    """The container's ``(uid, gid)`` and whether the workspace (owned by
    ``workspace_owner``) must be handed to it. ``euid``, ``ids`` (this process's uid and
    gid) and ``dedicated`` default to this process's and the setting's."""
    euid = os.geteuid() if euid is None else euid
    ids = (os.getuid(), os.getgid()) if ids is None else ids
    dedicated = settings().sandbox_uid if dedicated is None else dedicated
    if euid != 0:
        return (parse_user(configured) if configured else ids), False
    uid, gid = workspace_owner
    if configured:
        user = parse_user(configured)
    elif uid != 0:
        user = (uid, gid or uid)
    else:
        user = (dedicated, dedicated)
    return user, uid == 0


def hand_over(workspace: Path, user: tuple[int, int]) -> int:
    """Give the workspace tree to ``user`` (trouper is root); how many entries changed."""
    changed, skipped = chown_tree(str(workspace), *user)
    logger.info("workspace %s handed to %d:%d (%d entries; %d left alone)", workspace,
                user[0], user[1], changed, skipped)
    return changed


def prepare_io(io_dir: Path, user: tuple[int, int]) -> None:
    """Make the shell's input folder: owner-only (0700) and the container user's when
    trouper is root or is that user; 0711 when a normal user runs the container as
    another uid (it must pass; the trouper home's 0700 keeps other local users out)."""
    io_dir.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(io_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise NotADirectoryError(str(io_dir))
        if os.geteuid() == 0:
            os.fchown(fd, *user)
        os.fchmod(fd, 0o700 if os.geteuid() in (0, user[0]) else 0o711)
    finally:
        os.close(fd)


def user_of(container_user: str | None) -> tuple[int, int] | None:
    """``(uid, gid)`` of a container's configured user when it is numeric and not root;
    None (root, a name, or none: the image's, maybe root)."""
    try:
        return parse_user(container_user or "")
    except ValueError:
        return None
