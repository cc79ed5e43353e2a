"""File tools confined to the workspace: read_file, write_file, edit_file.

A path is relative to the workspace or absolute inside it; ``..`` is resolved by name
first, and a path that leaves the workspace is refused. Then the file is reached from a
descriptor of the workspace without following any symlink (``safefs``), so nothing that
is renamed or swapped meanwhile can lead outside. The policy, simple and safe:

- a symlink anywhere in the path is refused, even one that stays inside the workspace;
- only regular files are read or written: a FIFO, device or socket is refused without
  blocking (opened ``O_NONBLOCK``, checked with ``fstat`` on the descriptor);
- a write goes to a temporary file beside the target, then renames over it: it never
  writes through a symlink or into a file with other hard links (those are refused),
  keeps an existing file's mode but its setuid and setgid bits (the kernel clears them
  on any write but root's), and gives a new one ``0666 & ~umask`` (the shell's);
- when the server runs as root (a Docker runtime's, whose shell runs as the workspace's
  owner), a new file or folder takes the owner of the folder it is made in and a
  rewritten file keeps its owner (``owners``), so the shell can still change them.

This guards against the agent's mistakes, not against a hostile one: ``run`` can do
anything the user can. ``FileError`` messages are written for the agent: they become the
content of an ``error`` outcome. ``call_with_deadline`` bounds any file action in time.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from typing import Callable, TypeVar

from . import safefs
from .confine import FileError, Target, locate

MAX_READ_BYTES = 20 * 1024 * 1024
"""Files larger than this are not read whole (the agent can use ``run`` with sed/head)."""
FILE_TIMEOUT_S = 30.0
"""Default deadline of one file action; past it the agent gets an error outcome."""
_BINARY_PROBE_BYTES = 8192
T = TypeVar("T")
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY

__all__ = ["FileError", "call_with_deadline", "edit_file", "read_file", "write_file"]


def read_file(
    workspace: str, path: str, start_line: int | None = None, end_line: int | None = None
) -> str:
    """The file's lines, numbered, from ``start_line`` to ``end_line`` (1-based, inclusive)."""
    with locate(workspace, path) as target:
        text = _read_text(target)
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


def write_file(workspace: str, path: str, content: str, umask: int | None = None) -> str:
    """Create or overwrite ``path`` with ``content``, creating its parent folders.

    ``umask`` (default: this process's) gives new files and folders their modes.
    """
    umask = process_umask() if umask is None else umask
    with locate(workspace, path, create_mode=0o777 & ~umask) as target:
        existing = _existing(target)
        mode = _kept_mode(existing) if existing else 0o666 & ~umask
        _replace(target, content, mode)
    verb = "Overwrote" if existing else "Created"
    return f"{verb} {path} ({len(content)} characters, {_count_lines(content)} lines)."


def edit_file(workspace: str, path: str, old: str, new: str) -> str:
    """Replace the one occurrence of ``old`` in ``path`` with ``new``."""
    if not old:
        raise FileError("old must not be empty: give the exact text to replace.")
    with locate(workspace, path) as target:
        text, info = _read_text_and_stat(target)
        _check_writable(target, info)
        count = text.count(old)
        if count == 0:
            raise FileError(
                f"Found 0 occurrences of old in {path}: it must match the file exactly, "
                "including whitespace and indentation (read the file first)."
            )
        if count > 1:
            raise FileError(
                f"Found {count} occurrences of old in {path}: it must match exactly one; "
                "include more surrounding lines to make it unique."
            )
        line = text[: text.index(old)].count("\n") + 1
        _replace(target, text.replace(old, new, 1), _kept_mode(info))
    return f"Edited {path}: replaced 1 occurrence starting at line {line}."


def call_with_deadline(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """``fn()``, or FileError once ``timeout_s`` passed (its thread is abandoned)."""
    box: dict[str, object] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=work, name=f"file-{what}", daemon=True).start()
    if not done.wait(timeout_s):
        raise FileError(
            f"{what} did not finish within its deadline of {timeout_s:g} s (a slow or hung "
            "file system?) and was abandoned; it may still complete later. Check the file "
            "with run (ls -l, head) before trying again."
        )
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def process_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for a moment,
    for every thread)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


# ---- reading ----


def _read_text(target: Target) -> str:
    return _read_text_and_stat(target)[0]


def _read_text_and_stat(target: Target) -> tuple[str, os.stat_result]:
    fd = target.open(_READ_FLAGS, verb="read")
    try:
        info = os.fstat(fd)
        target.check_regular(info)
        data = _read_all(fd, target, info.st_size)
    finally:
        os.close(fd)
    return _decode(data, target.path), info


def _read_all(fd: int, target: Target, size: int) -> bytes:
    if size > MAX_READ_BYTES:
        raise FileError(
            f"{target.path} is too large to read whole ({size} bytes, limit {MAX_READ_BYTES}): "
            "use run with head, sed or grep instead."
        )
    chunks, total = [], 0
    try:
        while total <= MAX_READ_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_READ_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise FileError(f"Cannot read {target.path}: {e.strerror or e}.") from e
    if total > MAX_READ_BYTES:
        raise FileError(f"{target.path} grew past {MAX_READ_BYTES} bytes while being read.")
    return b"".join(chunks)


def _decode(data: bytes, path: str) -> str:
    if b"\x00" in data[:_BINARY_PROBE_BYTES]:
        raise FileError(f"{path} looks like a binary file (it contains NUL bytes).")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileError(
            f"{path} is not UTF-8 text (invalid byte 0x{data[e.start]:02x} at offset "
            f"{e.start}): a binary file?"
        ) from e


# ---- writing ----


def _existing(target: Target) -> os.stat_result | None:
    """The stat of the file ``target`` would replace (None if there is none); refuses
    what write_file must not replace."""
    try:
        fd = target.open(safefs.O_PATH or _READ_FLAGS, verb="write")
    except FileError as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    _check_writable(target, info)
    return info


def _check_writable(target: Target, info: os.stat_result) -> None:
    target.check_regular(info)
    if info.st_nlink > 1:
        raise FileError(
            f"{target.path} has {info.st_nlink} hard links (the same file under other names, "
            "maybe outside the workspace), so the file tools will not change it. To edit "
            f"this copy alone, break the link first with run: cp -p '{target.path}' "
            f"'{target.path}.copy' && mv '{target.path}.copy' '{target.path}'"
        )


def _kept_mode(info: os.stat_result) -> int:
    """The mode a rewritten file keeps: its own, without setuid and setgid."""
    return stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)


def _replace(target: Target, content: str, mode: int) -> None:
    data = content.encode("utf-8", "surrogateescape")
    try:
        safefs.replace_file(target.dir_fd, target.name, mode, lambda out: out.write(data))
    except OSError as e:
        raise FileError(f"Cannot write {target.path}: {e.strerror or e}.") from e


# ---- checks and small helpers ----


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
