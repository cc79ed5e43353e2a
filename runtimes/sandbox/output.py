"""Long output keeps its head and tail; the full text goes to a file the agent can read.

``OutputBuffer`` collects the output of one command as it arrives, secrets masked as it
comes (a secret split across reads is masked whole): all of it is appended to an
owner-only file (so it is kept even if nobody listens), and the part not yet shown to the
agent is kept in memory as a bounded head and tail.

Any bytes in, valid text out, raw bytes kept. The shell decodes a command's output with
``surrogateescape``: valid UTF-8 becomes its characters and each undecodable byte a lone
surrogate (U+DC80..U+DCFF) that encodes back to that byte. Secrets are masked on that
text, and the file gets it encoded back: the command's raw bytes, with every spelling of
a secret value (its UTF-8 bytes, or an escaped spelling) replaced by ``<secret:NAME>``. A
value's UTF-8 bytes in the raw stream always decode to the value (a UTF-8 sequence starts
with a byte no undecodable prefix can swallow), and a U+FFFD in a value also matches the
undecodable bytes it stands for, so masking the text masks the bytes. The agent is shown
those masked bytes decoded with ``replace`` (one U+FFFD for each invalid sequence), and
every character count (shown, cut) is of that text. ``fit_text`` and ``fit_pending`` turn
text, already masked, into an outcome's ``content``, ``elided_chars`` and
``full_output_path``. Masking comes first, so a cut can never leave half a secret; and a
cut never splits a ``<secret:NAME>`` placeholder either.
"""

from __future__ import annotations

import os
import re
from typing import BinaryIO, Callable, Optional, Tuple

from . import safefs
from .mask import TextMasker
from .stream import StreamMasker
from .util import open_private, safe_name

OUTPUTS_DIR = os.path.join(".trouper", "outputs")
"""Workspace-relative folder of the full outputs of truncated outcomes (0700, files 0600)."""
MAX_FILE_BYTES = 16 * 1024 * 1024
"""Output past this many bytes of one command is counted but no longer written to disk."""

Fitted = Tuple[str, int, Optional[str]]
"""``(content, elided_chars, full_output_path)``."""
_PLACEHOLDER = re.compile(r"<secret:[^<>\s]{1,200}>")
_PLACEHOLDER_MAX = 210
_SURROGATE = re.compile(r"[\ud800-\udfff]")


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

    def __init__(self, path: str, keep_chars: int, masker: TextMasker | None = None) -> None:
        self.path = path
        self._keep_chars = max(1, keep_chars)
        self._stream = StreamMasker(masker or TextMasker({}))
        self._file: BinaryIO | None = None
        """Opened (and the file made) at the first output: a command that prints nothing
        costs no file (a new inode per command is dear on some filesystems)."""
        self._closed = False
        try:
            self._bytes = os.lstat(path).st_size  # an action run again appends after it
        except FileNotFoundError:
            self._bytes = 0
        self.write_error: str | None = None
        """Why the file stopped taking output (a full disk), or None."""
        self._reset(self._bytes)

    def _reset(self, start_byte: int) -> None:
        self._head = ""
        self._tail = ""
        self._chars = 0
        self._start_byte = start_byte

    def append(self, text: str) -> None:
        """Add output as it arrives (masked; what might start a secret waits for more)."""
        self._add(self._stream.feed(text))

    def _add(self, text: str) -> None:
        if not text:
            return
        data = _raw(text)
        text = data.decode("utf-8", "replace") if _SURROGATE.search(text) else text
        if self._bytes < MAX_FILE_BYTES and self.write_error is None and not self._closed:
            try:
                if self._file is None:
                    self._file = os.fdopen(open_private(self.path, os.O_WRONLY | os.O_APPEND),
                                           "ab")
                self._file.write(data[: MAX_FILE_BYTES - self._bytes])
                self._file.flush()
            except OSError as e:  # a full disk: the command goes on, its ends are in memory
                self.write_error = f"the output file could not be written ({e.strerror or e})"
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
        """Add what the masker held back, then close the file (idempotent)."""
        if self._closed:
            return
        self._add(self._stream.flush())
        self._closed = True
        if self._file is not None:
            try:
                self._file.close()
            except OSError as e:
                self.write_error = f"the output file could not be written ({e.strerror or e})"


def _raw(text: str) -> bytes:
    """The bytes ``text`` was decoded from with ``surrogateescape``."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no byte decodes to: not from the shell
        return text.encode("utf-8", "replace")


def fit_text(text: str, max_chars: int, workspace: str, action_id: str) -> Fitted:
    """``text`` as an outcome shows it: whole, or head and tail with the whole in a file."""
    if len(text) <= max_chars:
        return text, 0, None
    rel, error = _save(workspace, action_id, lambda f: f.write(text.encode("utf-8", "replace")))
    head, tail = _clean_cut(text, *_split(max_chars))
    elided = len(text) - len(head) - len(tail)
    return _cut(head, tail, elided, rel, error), elided, rel


def fit_pending(
    pending: Pending, source_path: str, max_chars: int, workspace: str, action_id: str
) -> Fitted:
    """Like ``fit_text`` for a buffer's pending output, copying the whole from its file."""
    whole = pending.head + pending.tail
    if pending.total_chars <= max_chars:
        return whole, 0, None
    head, tail = _clean_cut(whole, *_split(max_chars))
    elided = pending.total_chars - len(head) - len(tail)
    rel, error = _save(workspace, action_id, lambda f: _copy_range(source_path, pending, f))
    if not error and pending.end_byte > MAX_FILE_BYTES:
        error = f"only the first {MAX_FILE_BYTES} bytes of the output were kept"
    return _cut(head, tail, elided, rel, error), elided, rel


def _split(max_chars: int) -> tuple[int, int]:
    head_chars = max(1, max_chars // 2)
    return head_chars, max(1, max_chars - head_chars)


def _clean_cut(text: str, head_chars: int, tail_chars: int) -> tuple[str, str]:
    """The first ``head_chars`` and last ``tail_chars`` of ``text``, each shortened so
    that it does not end (head) or start (tail) inside a ``<secret:NAME>`` placeholder."""
    head_end, tail_start = head_chars, len(text) - tail_chars
    window_end = head_end + _PLACEHOLDER_MAX
    for m in _PLACEHOLDER.finditer(text, max(0, head_end - _PLACEHOLDER_MAX), window_end):
        if m.start() >= head_end:
            break
        if head_end < m.end():
            head_end = m.start()
    for m in _PLACEHOLDER.finditer(text, max(0, tail_start - _PLACEHOLDER_MAX)):
        if m.start() >= tail_start:
            break
        if tail_start < m.end():
            tail_start = m.end()
    return text[:head_end], text[tail_start:]


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
    """Write the full output owner-only into the workspace, reached without symlinks (an
    agent's symlink at ``.trouper/outputs`` cannot redirect it outside)."""
    name = safe_name(action_id) + ".log"
    try:
        root_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            dir_fd = safefs.open_dirs(root_fd, OUTPUTS_DIR.split(os.sep), create_mode=0o700)
        finally:
            os.close(root_fd)
        try:
            safefs.replace_file(dir_fd, name, 0o600, write)
        finally:
            os.close(dir_fd)
    except OSError as e:
        return None, f"{type(e).__name__}: {e}"
    return os.path.join(OUTPUTS_DIR, name), ""


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
