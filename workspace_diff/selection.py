"""Which of a workspace's files a baseline keeps, or a diff compares, under the limits.

git lists the files it would track (``ls-files --others --exclude-standard``: ignored
ones aside, by the workspace's ``.gitignore`` files and its repository's
``info/exclude``); from them, a folder git lists whole is a repository of its own inside
the workspace (never compared: git would record only its commit), and a file larger
than ``diff_max_file_bytes`` is left out. Both are named, so the diff can say so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .git import ShadowGit, nul_list


@dataclass(frozen=True)
class Selection:
    """The files to compare, and what was left out and why."""

    files: tuple[str, ...]
    too_large: tuple[str, ...]
    """Larger than the limit: not compared."""
    repositories: tuple[str, ...]
    """Folders holding a repository of their own (``sub/``): not compared."""
    total_bytes: int
    """The size of ``files`` together."""


def new_files(git: ShadowGit) -> list[str]:
    """The work tree's files that git does not track yet and does not ignore."""
    return nul_list(git.run("ls-files", "--others", "--exclude-standard", "-z"))


def select(workspace: Path, listed: list[str], max_file_bytes: int,
           skip: frozenset[str] = frozenset(), hidden: str | None = None) -> Selection:
    """``listed`` (work-tree paths as git lists them) split by the limits; ``skip``:
    paths left out before (too large when the baseline was taken); ``hidden``: a folder
    (``path/``) never to copy nor show, whatever it holds (the trouper home)."""
    files, too_large, repositories, total = [], [], [], 0
    for path in listed:
        if hidden is not None and path.startswith(hidden):
            continue
        if path.endswith("/"):
            repositories.append(path)
            continue
        if path in skip:
            continue
        size = file_size(workspace / path)
        if size > max_file_bytes:
            too_large.append(path)
            continue
        files.append(path)
        total += size
    return Selection(tuple(files), tuple(too_large), tuple(repositories), total)


def holding_secrets(workspace: Path, files: tuple[str, ...],
                    values: tuple[bytes, ...]) -> tuple[str, ...]:
    """Those of ``files`` that hold one of the session's secret ``values``: a baseline
    never copies them (a secret is stored nowhere but the secrets file: I7,
    docs/promises.md)."""
    if not values:
        return ()
    return tuple(path for path in files if _holds_any(workspace / path, values))


def _holds_any(path: Path, values: tuple[bytes, ...]) -> bool:
    """Whether the file (never a link's target) holds one of ``values``."""
    try:
        if path.is_symlink():
            return any(value in os.fsencode(os.readlink(path)) for value in values)
        data = path.read_bytes()
    except OSError:
        return False
    return any(value in data for value in values)


def home_inside(home: Path, workspace: Path) -> str | None:
    """The trouper home's path in the workspace (``.trouper/``) when the workspace holds
    it (a workspace that is the user's home folder): its store and secrets are never
    copied into a baseline nor shown in a diff. None when it is elsewhere."""
    try:
        relative = home.resolve().relative_to(workspace.resolve())
    except (OSError, ValueError):
        return None
    return "" if relative == Path(".") else f"{relative.as_posix()}/"


def file_size(path: Path) -> int:
    """A file's size (a link's own, never its target's); 0 when it is gone."""
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def size_text(size: int) -> str:
    """``1 MiB``, ``300 KiB``, ``12 bytes``: a limit as a person reads it."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.3g} {unit}"
    return f"{size} bytes"


__all__ = ["Selection", "file_size", "holding_secrets", "home_inside", "new_files", "select",
           "size_text"]
