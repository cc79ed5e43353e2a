"""Long output keeps its head and tail; the full text goes to a file the agent can read.

``OutputBuffer`` collects the output of one command as it arrives: all of it is appended
to a file (so it is kept even if nobody listens), and the part not yet shown to the agent
is kept in memory as a bounded head and tail. ``fit_text`` and ``fit_pending`` turn text
into an outcome's ``content``, ``elided_chars`` and ``full_output_path``.
"""

from __future__ import annotations

import os
from typing import BinaryIO, Callable, Optional, Tuple

from .util import safe_name

OUTPUTS_DIR = os.path.join(".trouper", "outputs")
"""Workspace-relative folder of the full outputs of truncated outcomes."""
MAX_FILE_BYTES = 16 * 1024 * 1024
"""Output past this many bytes of one command is counted but no longer written to disk."""

Fitted = Tuple[str, int, Optional[str]]
"""``(content, elided_chars, full_output_path)``."""


class Pending:
    """Output not yet shown to the agent: a head, a tail and where the whole is on disk."""

    def __init__(self, head: str, tail: str, total_chars: int, start_byte: int, end_byte: int):
        self.head = head
        self.tail = tail
        """The last characters after ``head`` (empty while everything fits in ``head``)."""
        self.total_chars = total_chars
        self.start_byte = start_byte
        self.end_byte = end_byte
        """Byte range of this output in the buffer's file (end may be past the file cap)."""


class OutputBuffer:
    """The output of one command: the whole in a file, the unseen part's ends in memory."""

    def __init__(self, path: str, keep_chars: int) -> None:
        self.path = path
        self._keep_chars = max(1, keep_chars)
        self._file = open(path, "ab")
        self._bytes = self._file.tell()
        self._reset(self._bytes)

    def _reset(self, start_byte: int) -> None:
        self._head = ""
        self._tail = ""
        self._chars = 0
        self._start_byte = start_byte

    def append(self, text: str) -> None:
        """Add output as it arrives."""
        if not text:
            return
        data = text.encode("utf-8", "replace")
        if self._bytes < MAX_FILE_BYTES:
            self._file.write(data[: MAX_FILE_BYTES - self._bytes])
            self._file.flush()
        self._bytes += len(data)
        self._chars += len(text)
        room = self._keep_chars - len(self._head)
        if room > 0:
            self._head += text[:room]
            text = text[room:]
        if text:
            self._tail = (self._tail + text)[-self._keep_chars :]

    @property
    def unseen_chars(self) -> int:
        """How many characters arrived since the last ``take``."""
        return self._chars

    def take(self) -> Pending:
        """The output not yet shown, which from now on counts as shown."""
        pending = Pending(self._head, self._tail, self._chars, self._start_byte, self._bytes)
        self._reset(self._bytes)
        return pending

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()


def fit_text(text: str, max_chars: int, workspace: str, action_id: str) -> Fitted:
    """``text`` as an outcome shows it: whole, or head and tail with the whole in a file."""
    if len(text) <= max_chars:
        return text, 0, None
    rel, error = _save(workspace, action_id, lambda f: f.write(text.encode("utf-8", "replace")))
    head_chars, tail_chars = _split(max_chars)
    elided = len(text) - head_chars - tail_chars
    return _cut(text[:head_chars], text[-tail_chars:], elided, rel, error), elided, rel


def fit_pending(
    pending: Pending, source_path: str, max_chars: int, workspace: str, action_id: str
) -> Fitted:
    """Like ``fit_text`` for a buffer's pending output, copying the whole from its file."""
    whole = pending.head + pending.tail
    if pending.total_chars <= max_chars:
        return whole, 0, None
    head_chars, tail_chars = _split(max_chars)
    elided = pending.total_chars - head_chars - tail_chars
    rel, error = _save(workspace, action_id, lambda f: _copy_range(source_path, pending, f))
    if not error and pending.end_byte > MAX_FILE_BYTES:
        error = f"only the first {MAX_FILE_BYTES} bytes of the output were kept"
    return _cut(whole[:head_chars], whole[-tail_chars:], elided, rel, error), elided, rel


def _split(max_chars: int) -> tuple[int, int]:
    head_chars = max(1, max_chars // 2)
    return head_chars, max(1, max_chars - head_chars)


def _cut(head: str, tail: str, elided: int, rel: str | None, error: str) -> str:
    if rel and not error:
        where = f"the full output is in {rel} (read it with start_line/end_line, or grep it)"
    elif rel:
        where = f"the full output is in {rel}, but {error}"
    else:
        where = f"the full output could not be saved: {error}"
    return f"{head}\n\n[... {elided} characters cut from the middle; {where} ...]\n\n{tail}"


def _save(
    workspace: str, action_id: str, write: Callable[[BinaryIO], object]
) -> tuple[str | None, str]:
    rel = os.path.join(OUTPUTS_DIR, safe_name(action_id) + ".log")
    try:
        os.makedirs(os.path.join(workspace, OUTPUTS_DIR), exist_ok=True)
        with open(os.path.join(workspace, rel), "wb") as f:
            write(f)
    except OSError as e:
        return None, f"{type(e).__name__}: {e}"
    return rel, ""


def _copy_range(source_path: str, pending: Pending, out: BinaryIO) -> None:
    end = min(pending.end_byte, MAX_FILE_BYTES)
    with open(source_path, "rb") as src:
        src.seek(pending.start_byte)
        remaining = max(0, end - pending.start_byte)
        while remaining > 0:
            block = src.read(min(remaining, 1 << 20))
            if not block:
                break
            out.write(block)
            remaining -= len(block)
