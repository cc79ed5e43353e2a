"""git's diff output read into ``FileChange``s: statuses, line counts and patches.

The three outputs (``--name-status -z``, ``--numstat -z``, the patch) come from the same
comparison with renames off, so each lists the same files in the same (path) order: the
patch is cut at its ``diff --git`` lines and its pieces matched to ``--numstat``'s paths.
"""

from __future__ import annotations

import os
import re

from .git import shown
from .model import BINARY_CHANGED, ChangeKind, FileChange

KINDS: dict[str, ChangeKind] = {"A": "added", "M": "modified", "T": "modified",
                                "D": "deleted"}
MAX_PATCH_BYTES = 4 * 1024 * 1024
"""The patches of one diff together (git's output is read no further): past it, the rest
of the files are listed without theirs (a note says how many)."""
TOO_LONG = "the diff is too long to show whole"
_FILE_HEADER = re.compile(rb"^(?=diff --git )", re.MULTILINE)
_BINARY_LINE = re.compile(r"^Binary files .* differ$", re.MULTILINE)


def name_status(raw: bytes) -> list[tuple[ChangeKind, str]]:
    """``--name-status -z``: each file's change and path."""
    parts = [p for p in raw.split(b"\0") if p]
    return [(KINDS.get(parts[i].decode()[:1], "modified"), os.fsdecode(parts[i + 1]))
            for i in range(0, len(parts) - 1, 2)]


def numstat(raw: bytes) -> list[tuple[str, int, int, bool]]:
    """``--numstat -z``: each file's path, lines added and removed, and whether it is
    binary (git counts no lines in it)."""
    rows = []
    for entry in (e for e in raw.split(b"\0") if e):
        added, removed, path = entry.split(b"\t", 2)
        binary = added == b"-"
        rows.append((os.fsdecode(path), 0 if binary else int(added),
                     0 if binary else int(removed), binary))
    return rows


def file_patches(raw: bytes, paths: list[str], cut: bool = False) -> dict[str, str]:
    """The patch cut into one piece a file, keyed by ``paths`` (``numstat``'s order); a
    binary file's ``Binary files ... differ`` reads ``binary file changed``. ``cut``: the
    patch was read up to ``MAX_PATCH_BYTES`` only; its last piece, incomplete, is dropped
    and the files after it have none."""
    pieces = [p for p in _FILE_HEADER.split(raw) if p]
    if cut:
        pieces = pieces[:-1]
    if len(pieces) > len(paths) or (not cut and len(pieces) != len(paths)):
        raise ValueError(f"git's patch has {len(pieces)} files, its numstat {len(paths)}")
    return {path: _BINARY_LINE.sub(BINARY_CHANGED, piece.decode("utf-8", "replace"))
            for path, piece in zip(paths, pieces, strict=False)}


def changes(statuses: list[tuple[ChangeKind, str]], counts: list[tuple[str, int, int, bool]],
            patches: dict[str, str], left_out: dict[str, str]) -> tuple[list[FileChange], int]:
    """The ``FileChange`` of every file, and how many lost their patch to the cap."""
    by_path = {path: (added, removed, binary) for path, added, removed, binary in counts}
    out, cut = [], 0
    for change, path in statuses:
        added, removed, binary = by_path.get(path, (0, 0, False))
        why = left_out.get(path, "")
        patch = "" if why else patches.get(path, "")
        if not why and path not in patches:
            why, cut = TOO_LONG, cut + 1
        out.append(FileChange(path=shown(path), change=change, binary=binary,
                              added_lines=added, removed_lines=removed, patch=patch,
                              left_out=why))
    return out, cut


__all__ = ["MAX_PATCH_BYTES", "TOO_LONG", "changes", "file_patches", "name_status", "numstat"]
