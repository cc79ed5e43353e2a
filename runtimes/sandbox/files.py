"""File tools confined to the workspace: read_file, write_file, edit_file.

A path is relative to the workspace or absolute inside it. Anything that resolves outside
the workspace (``..``, an absolute path elsewhere, a symlink pointing out) raises
``FileError`` before the file is touched. ``FileError`` messages are written for the
agent: they become the content of an ``error`` outcome.
"""

from __future__ import annotations

import os

MAX_READ_BYTES = 20 * 1024 * 1024
"""Files larger than this are not read whole (the agent can use ``run`` with sed/head)."""
_BINARY_PROBE_BYTES = 8192


class FileError(Exception):
    """A file action that cannot be done; the message is meant for the agent."""


def resolve(workspace: str, path: str) -> str:
    """The real path of ``path`` inside ``workspace``; FileError when it points outside."""
    if not path or "\x00" in path:
        raise FileError(f"Invalid path {path!r}: it must be a non-empty path without NUL bytes.")
    root = os.path.realpath(workspace)
    lexical = os.path.normpath(os.path.join(root, path))
    real = os.path.realpath(lexical)
    if _inside(real, root):
        return real
    how = " through a symlink" if _inside(lexical, root) else ""
    raise FileError(
        f"Path {path!r} resolves{how} to {real}, outside the workspace {root}: only "
        "files inside the workspace can be used."
    )


def read_file(
    workspace: str, path: str, start_line: int | None = None, end_line: int | None = None
) -> str:
    """The file's lines, numbered, from ``start_line`` to ``end_line`` (1-based, inclusive)."""
    text = _read_text(resolve(workspace, path), path)
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if not text:
        lines = []
    first, last = _line_range(path, len(lines), start_line, end_line)
    if not lines:
        return f"({path} is empty)"
    numbered = "\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(first, last + 1))
    if first == 1 and last == len(lines):
        return numbered
    return f"{numbered}\n[lines {first}-{last} of {len(lines)} in {path}]"


def write_file(workspace: str, path: str, content: str) -> str:
    """Create or overwrite ``path`` with ``content``, creating its parent folders."""
    real = resolve(workspace, path)
    if os.path.isdir(real):
        raise FileError(f"{path} is a directory; write_file needs a file path.")
    existed = os.path.exists(real)
    try:
        os.makedirs(os.path.dirname(real), exist_ok=True)
        with open(real, "w", encoding="utf-8", newline="") as f:
            f.write(content)
    except OSError as e:
        raise FileError(f"Cannot write {path}: {e.strerror or e}.") from e
    verb = "Overwrote" if existed else "Created"
    return f"{verb} {path} ({len(content)} characters, {_count_lines(content)} lines)."


def edit_file(workspace: str, path: str, old: str, new: str) -> str:
    """Replace the one occurrence of ``old`` in ``path`` with ``new``."""
    if not old:
        raise FileError("old must not be empty: give the exact text to replace.")
    real = resolve(workspace, path)
    text = _read_text(real, path)
    count = text.count(old)
    if count == 0:
        raise FileError(
            f"Found 0 occurrences of old in {path}: it must match the file exactly, including "
            "whitespace and indentation (read the file first)."
        )
    if count > 1:
        raise FileError(
            f"Found {count} occurrences of old in {path}: it must match exactly one; include "
            "more surrounding lines to make it unique."
        )
    line = text[: text.index(old)].count("\n") + 1
    try:
        with open(real, "w", encoding="utf-8", newline="") as f:
            f.write(text.replace(old, new, 1))
    except OSError as e:
        raise FileError(f"Cannot write {path}: {e.strerror or e}.") from e
    return f"Edited {path}: replaced 1 occurrence starting at line {line}."


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _read_text(real: str, path: str) -> str:
    if not os.path.lexists(real):
        raise FileError(f"No such file: {path}.")
    if os.path.isdir(real):
        raise FileError(f"{path} is a directory, not a file (list it with: run ls).")
    if not os.path.isfile(real):
        raise FileError(f"{path} is not a regular file (a device, socket or pipe).")
    size = os.path.getsize(real)
    if size > MAX_READ_BYTES:
        raise FileError(
            f"{path} is too large to read whole ({size} bytes, limit {MAX_READ_BYTES}): use "
            "run with head, sed or grep instead."
        )
    try:
        with open(real, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FileError(f"Cannot read {path}: {e.strerror or e}.") from e
    if b"\x00" in data[:_BINARY_PROBE_BYTES]:
        raise FileError(f"{path} looks like a binary file (it contains NUL bytes).")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileError(
            f"{path} is not UTF-8 text (invalid byte 0x{data[e.start]:02x} at offset "
            f"{e.start}): a binary file?"
        ) from e


def _line_range(
    path: str, count: int, start_line: int | None, end_line: int | None
) -> tuple[int, int]:
    first = 1 if start_line is None else start_line
    last = count if end_line is None else min(end_line, count)
    if first < 1:
        raise FileError(f"start_line must be 1 or more (got {first}).")
    if end_line is not None and end_line < first:
        raise FileError(f"end_line ({end_line}) is before start_line ({first}).")
    if count and first > count:
        raise FileError(f"start_line {first} is past the end of {path} ({count} lines).")
    return first, last


def _count_lines(text: str) -> int:
    return text.count("\n") + (0 if not text or text.endswith("\n") else 1)
